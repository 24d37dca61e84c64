/* The NCCL net plugin logger is C-variadic, which stable Rust cannot define. This shim formats the
 * line with vsnprintf and forwards the finished string to a Rust sink registered at start-up. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*tcpx_ffi_log_sink_t)(int level, unsigned long flags, const char *file, int line,
                                    const char *msg);

static tcpx_ffi_log_sink_t tcpx_ffi_sink;

void tcpx_ffi_set_log_sink(tcpx_ffi_log_sink_t sink) {
  __atomic_store_n(&tcpx_ffi_sink, sink, __ATOMIC_RELEASE);
}

void tcpx_ffi_logger(int level, unsigned long flags, const char *file, int line, const char *fmt,
                     ...) {
  tcpx_ffi_log_sink_t sink = __atomic_load_n(&tcpx_ffi_sink, __ATOMIC_ACQUIRE);
  if (sink == NULL) return;
  if (fmt == NULL) {
    sink(level, flags, file, line, "(plugin logged a NULL format)");
    return;
  }
  char small[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    sink(level, flags, file, line, "(plugin log line could not be formatted)");
    return;
  }
  if ((size_t)n < sizeof small) {
    sink(level, flags, file, line, small);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (big == NULL) {
    sink(level, flags, file, line, small); /* truncated, but better than nothing */
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sink(level, flags, file, line, big);
  free(big);
}
