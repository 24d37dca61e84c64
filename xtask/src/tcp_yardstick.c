/* Plain C TCP over loopback: the yardstick `tcpx-run bench` and `tcpx-run baseline` are held to.
 *
 * One message of SIZE bytes lives in a sender buffer and a receiver buffer of SIZE bytes each
 * (DRAM-resident once SIZE is past the last-level cache, as the tool's are). It is cut into K
 * contiguous slices; stream i has one sender thread that write()s slice i and one receiver thread
 * that read()s it into the same slice of the receiver buffer, ITERS times, at most CALL bytes per
 * write() or read() call (default 1 MiB; 0 = the whole slice in one call). Buffers are touched and
 * connections made before the clock starts; the clock stops when the last receiver has all its
 * bytes. Prints one JSON line per stream count:
 *   {"kind":"c_tcp","streams":K,"call":CALL,"bytes":B,"secs":S,"gbps":G}
 *
 * Usage: tcp_yardstick SIZE_BYTES ITERS K[,K...] [REPS [CALL_BYTES]]   (REPS runs per K)
 * TCP_YARDSTICK_SYNC=1 makes every iteration a transfer of its own: all sender and receiver threads
 * meet at a barrier after each iteration, so no stream starts iteration i+1 before every receiver
 * has all of iteration i (as `tcpx-run bench` times each iteration), instead of streaming ITERS
 * iterations back to back. Threads are named ys-tx-I and ys-rx-I for per-thread profiles.
 * TCP_YARDSTICK_FREE=SECS runs free (what `iperf3 -P K` with large buffers measures, the physical
 * ceiling the tool is held to): each stream has its own SIZE-byte sender and receiver buffers; its
 * sender write()s the whole buffer over and over (CALL bytes per call, 0 = whole buffer) for SECS
 * seconds and then closes its side, its receiver read()s into its own buffer until the end of the
 * stream; no barrier after the start. ITERS is ignored; bytes are what the receivers got, the
 * clock stops when the last receiver has seen the end. Prints kind "c_free".
 * The line also gives the process's CPU over the timed part (getrusage: "user_s", "sys_s", and
 * context switches "csw"), for per-byte costs next to the tool's, and the data system calls of
 * the senders and of the receivers ("tx_calls", "rx_calls"; every read/write/send counted, as
 * `tcpx-run bench` counts its own in its "socket_calls").
 * TCP_YARDSTICK_BUF=BYTES sets SO_SNDBUF and SO_RCVBUF on every socket (default: autotuning).
 * TCP_YARDSTICK_SKEW=BYTES: each stream first moves BYTES bytes (as a greeting or header would),
 * so the bulk data is misaligned by that much in the socket's pages (free-running only).
 * TCP_YARDSTICK_WALK=1 (free-running only): each receiver's reads walk its whole buffer (each read
 * lands after the previous one, wrapping at the end), as the tool's receives fill a whole request;
 * without it every read starts at the buffer's start, so received bytes land in the same few
 * cache-resident MiB (what iperf3 does). Prints kind "c_free_walk".
 * TCP_YARDSTICK_BOUNCE=BYTES: each receiver read()s into a buffer of its own of BYTES bytes (small
 * enough to stay in the core's cache) and copies each read on into its destination (free-running:
 * its walking buffer; timed: its slice); with TCP_YARDSTICK_NT=1 that copy uses non-temporal
 * (streaming) stores, which write the destination without first reading it into the cache.
 * Prints kind "c_free_walk_bounce", "c_free_walk_bounce_nt", or for timed runs "c_tcp_bounce",
 * "c_tcp_sync_bounce_nt" and the like (not with TCP_YARDSTICK_ZEROCOPY).
 * TCP_YARDSTICK_ZEROCOPY=1 sends with MSG_ZEROCOPY (completions drained and ignored: a throughput
 * probe of the kernel path, not a correct program, since buffers are reused without waiting).
 * Build: gcc -O2 -pthread -o tcp_yardstick tcp_yardstick.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <time.h>
#include <unistd.h>

struct job {
  int fd;
  char *p;
  size_t len;
  size_t call;
  long iters;
  pthread_barrier_t *start;
  pthread_barrier_t *each; /* NULL: iterations stream back to back */
  int send;
  int index;
  int err;
  int zerocopy;
  double free_secs; /* > 0: free-running for this long (senders); receivers read until the end */
  size_t got;       /* bytes a free-running receiver got */
  size_t skew;      /* free-running: bytes moved first, to misalign the rest */
  int walk;         /* free-running receiver: reads walk the buffer instead of reusing its start */
  size_t bounce;    /* walking receiver: read into a cache-sized buffer of this size, then copy */
  int nt;           /* that copy with non-temporal stores */
  long calls;       /* read/write/send system calls made on the stream's data */
  char *bouncebuf;  /* timed receiver with a bounce: its buffer of `bounce` bytes */
};

/* Discards MSG_ZEROCOPY completion notices so the socket's error queue never fills. */
static void drain_errqueue(int fd) {
  char control[256];
  for (;;) {
    struct msghdr m = {.msg_control = control, .msg_controllen = sizeof control};
    if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) return;
  }
}

static double now(void);

/* Copies n bytes with 32-byte non-temporal stores where the destination is aligned for them
 * (x86-64; elsewhere an ordinary copy). */
#if !defined(__x86_64__)
static void copy_nt(char *d, const char *s, size_t n) { memcpy(d, s, n); }
#else
__attribute__((target("avx2"))) static void copy_nt(char *d, const char *s, size_t n) {
  size_t head = (32 - ((uintptr_t)d & 31)) & 31;
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 128; d += 128, s += 128, n -= 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)(s + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64)), e = _mm256_loadu_si256((const __m256i *)(s + 96));
    _mm256_stream_si256((__m256i *)d, a);
    _mm256_stream_si256((__m256i *)(d + 32), b);
    _mm256_stream_si256((__m256i *)(d + 64), c);
    _mm256_stream_si256((__m256i *)(d + 96), e);
  }
  memcpy(d, s, n);
  _mm_sfence();
}
#endif

/* Free-running: a sender writes its buffer again and again until its time is up, then closes its
 * side; a receiver reads into its buffer until the end of the stream. */
static void *free_run(struct job *j) {
  for (size_t done = 0; done < j->skew;) {
    ssize_t n = j->send ? write(j->fd, j->p + done, j->skew - done) : read(j->fd, j->p + done, j->skew - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) { j->err = n == 0 ? ECONNRESET : errno; return NULL; }
    done += (size_t)n;
  }
  if (j->send) {
    double stop = now() + j->free_secs;
    while (now() < stop) {
      size_t done = 0;
      while (done < j->len) {
        size_t want = j->len - done;
        if (j->call && want > j->call) want = j->call;
        ssize_t n = write(j->fd, j->p + done, want);
        j->calls++;
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { j->err = n == 0 ? ECONNRESET : errno; return NULL; }
        done += (size_t)n;
      }
    }
    shutdown(j->fd, SHUT_WR);
    return NULL;
  }
  /* Walking: each read lands after the last one, wrapping at the end, so the receiver writes its
   * whole buffer as an application's receive buffer is written; otherwise every read starts at
   * the buffer's start and lands in the same few cache-resident MiB. */
  char *bounce = j->bounce ? aligned_alloc(4096, (j->bounce + 4095) & ~(size_t)4095) : NULL;
  if (j->bounce && !bounce) { j->err = ENOMEM; return NULL; }
  if (bounce) memset(bounce, 0, j->bounce);
  for (size_t at = 0; bounce;) {
    size_t room = j->len - at;
    ssize_t n = read(j->fd, bounce, room < j->bounce ? room : j->bounce);
    j->calls++;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) { if (n < 0) j->err = errno; free(bounce); return NULL; }
    if (j->nt) copy_nt(j->p + at, bounce, (size_t)n);
    else memcpy(j->p + at, bounce, (size_t)n);
    j->got += (size_t)n;
    at = at + (size_t)n == j->len ? 0 : at + (size_t)n;
  }
  for (size_t at = 0;;) {
    size_t room = j->walk ? j->len - at : j->len;
    size_t want = j->call && j->call < room ? j->call : room;
    ssize_t n = read(j->fd, j->p + at, want);
    j->calls++;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { j->err = errno; return NULL; }
    if (n == 0) return NULL;
    j->got += (size_t)n;
    if (j->walk) at = at + (size_t)n == j->len ? 0 : at + (size_t)n;
  }
}

static void *worker(void *arg) {
  struct job *j = arg;
  char name[16];
  snprintf(name, sizeof name, "ys-%s-%d", j->send ? "tx" : "rx", j->index);
  pthread_setname_np(pthread_self(), name);
  pthread_barrier_wait(j->start);
  if (j->free_secs > 0) return free_run(j);
  if (j->bounce && !j->send) {
    j->bouncebuf = aligned_alloc(4096, (j->bounce + 4095) & ~(size_t)4095);
    if (!j->bouncebuf) { j->err = ENOMEM; return NULL; }
    memset(j->bouncebuf, 0, j->bounce);
  }
  for (long it = 0; it < j->iters; it++) {
    if (it && j->each) pthread_barrier_wait(j->each);
    size_t done = 0;
    while (done < j->len) {
      size_t want = j->len - done;
      if (j->call && want > j->call) want = j->call;
      ssize_t n;
      if (j->send && j->zerocopy) {
        n = send(j->fd, j->p + done, want, MSG_ZEROCOPY);
        drain_errqueue(j->fd);
        if (n < 0 && errno == ENOBUFS) { drain_errqueue(j->fd); continue; }
      } else if (!j->send && j->bounce) {
        n = read(j->fd, j->bouncebuf, want < j->bounce ? want : j->bounce);
        if (n > 0) {
          if (j->nt) copy_nt(j->p + done, j->bouncebuf, (size_t)n);
          else memcpy(j->p + done, j->bouncebuf, (size_t)n);
        }
      } else {
        n = j->send ? write(j->fd, j->p + done, want) : read(j->fd, j->p + done, want);
      }
      j->calls++;
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) { j->err = n == 0 ? ECONNRESET : errno; free(j->bouncebuf); return NULL; }
      done += (size_t)n;
    }
  }
  free(j->bouncebuf);
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int run(size_t size, long iters, int k, size_t call) {
  const char *zc = getenv("TCP_YARDSTICK_ZEROCOPY");
  int zerocopy = zc && *zc && strcmp(zc, "0");
  const char *sy = getenv("TCP_YARDSTICK_SYNC");
  int sync = sy && *sy && strcmp(sy, "0");
  const char *fr = getenv("TCP_YARDSTICK_FREE");
  double free_secs = fr && *fr ? atof(fr) : 0;
  const char *bf = getenv("TCP_YARDSTICK_BUF");
  int sockbuf = bf && *bf ? atoi(bf) : 0;
  const char *sk = getenv("TCP_YARDSTICK_SKEW");
  size_t skew = sk && *sk && free_secs > 0 ? strtoull(sk, NULL, 10) : 0;
  if (skew >= size) skew = 0;
  const char *wk = getenv("TCP_YARDSTICK_WALK");
  int walk = wk && *wk && strcmp(wk, "0");
  const char *bo = getenv("TCP_YARDSTICK_BOUNCE");
  size_t bounce = bo && *bo && !zerocopy ? strtoull(bo, NULL, 10) : 0;
  if (bounce && free_secs > 0) walk = 1;
  const char *ntv = getenv("TCP_YARDSTICK_NT");
  int nt = bounce && ntv && *ntv && strcmp(ntv, "0");
  /* Free-running: every stream has buffers of its own, SIZE bytes each. */
  size_t total = free_secs > 0 ? size * (size_t)k : size;
  char *tx = malloc(total), *rx = malloc(total);
  if (!tx || !rx) { fprintf(stderr, "tcp_yardstick: out of memory for 2 x %zu bytes\n", total); return 1; }
  memset(tx, 0x5a, total);
  memset(rx, 0, total);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (lfd < 0 || bind(lfd, (void *)&a, sizeof a) || listen(lfd, 128) || getsockname(lfd, (void *)&a, &al)) {
    perror("tcp_yardstick: listen on 127.0.0.1");
    return 1;
  }
  size_t per = (size + k - 1) / k;
  struct job *jobs = calloc(2 * k, sizeof *jobs);
  pthread_t *th = calloc(2 * k, sizeof *th);
  pthread_barrier_t start;
  pthread_barrier_t each;
  pthread_barrier_init(&start, NULL, 2 * k + 1);
  pthread_barrier_init(&each, NULL, 2 * k);
  for (int i = 0; i < k; i++) {
    int c = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (c >= 0 && sockbuf > 0) {
      setsockopt(c, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
      setsockopt(c, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
    }
    if (c < 0 || connect(c, (void *)&a, sizeof a)) { perror("tcp_yardstick: connect"); return 1; }
    int s = accept(lfd, NULL, NULL);
    if (s < 0) { perror("tcp_yardstick: accept"); return 1; }
    if (sockbuf > 0) {
      setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
      setsockopt(s, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (zerocopy && setsockopt(c, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) { perror("tcp_yardstick: SO_ZEROCOPY"); return 1; }
    size_t off = per * i, len = off >= size ? 0 : (size - off < per ? size - off : per);
    if (free_secs > 0) off = size * (size_t)i, len = size;
    pthread_barrier_t *e = sync ? &each : NULL;
    jobs[2 * i] = (struct job){c, tx + off, len, call, iters, &start, e, 1, i, 0, zerocopy, free_secs, 0, skew};
    jobs[2 * i + 1] = (struct job){s, rx + off, len, call, iters, &start, e, 0, i, 0, 0, free_secs, 0, skew, walk, bounce, nt};
  }
  for (int i = 0; i < 2 * k; i++) pthread_create(&th[i], NULL, worker, &jobs[i]);
  pthread_barrier_wait(&start);
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = now();
  for (int i = 1; i < 2 * k; i += 2) pthread_join(th[i], NULL);
  double secs = now() - t0;
  for (int i = 0; i < 2 * k; i += 2) pthread_join(th[i], NULL);
  getrusage(RUSAGE_SELF, &r1);
#define TV(t) ((t).tv_sec + (t).tv_usec * 1e-6)
  double user_s = TV(r1.ru_utime) - TV(r0.ru_utime), sys_s = TV(r1.ru_stime) - TV(r0.ru_stime);
  long csw = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw);
  for (int i = 0; i < 2 * k; i++) {
    if (jobs[i].err) { fprintf(stderr, "tcp_yardstick: stream %d: %s\n", i / 2, strerror(jobs[i].err)); return 1; }
    close(jobs[i].fd);
  }
  close(lfd);
  double bytes = (double)size * iters;
  if (free_secs > 0) {
    bytes = 0;
    for (int i = 1; i < 2 * k; i += 2) bytes += (double)jobs[i].got;
  }
  long tx_calls = 0, rx_calls = 0;
  for (int i = 0; i < 2 * k; i++) *(i % 2 ? &rx_calls : &tx_calls) += jobs[i].calls;
  const char *kind = free_secs > 0 ? (bounce ? (nt ? "c_free_walk_bounce_nt" : "c_free_walk_bounce") : walk ? "c_free_walk" : "c_free") : zerocopy ? "c_tcp_zerocopy" : bounce ? (nt ? (sync ? "c_tcp_sync_bounce_nt" : "c_tcp_bounce_nt") : (sync ? "c_tcp_sync_bounce" : "c_tcp_bounce")) : sync ? "c_tcp_sync" : "c_tcp";
  printf("{\"kind\":\"%s\",\"streams\":%d,\"call\":%zu,\"bytes\":%.0f,\"secs\":%.6f,\"gbps\":%.3f,\"user_s\":%.3f,\"sys_s\":%.3f,\"csw\":%ld,\"tx_calls\":%ld,\"rx_calls\":%ld}\n",
         kind, k, call, bytes, secs, bytes / secs / 1e9, user_s, sys_s, csw, tx_calls, rx_calls);
  fflush(stdout);
  free(tx); free(rx); free(jobs); free(th);
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&each);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s SIZE_BYTES ITERS K[,K...] [REPS [CALL_BYTES]]\n", argv[0]);
    return 2;
  }
  size_t size = strtoull(argv[1], NULL, 10);
  long iters = strtol(argv[2], NULL, 10);
  int reps = argc > 4 ? atoi(argv[4]) : 1;
  size_t call = argc > 5 ? strtoull(argv[5], NULL, 10) : (size_t)1 << 20;
  if (!size || iters < 1 || reps < 1) { fprintf(stderr, "tcp_yardstick: SIZE, ITERS, REPS must be >= 1\n"); return 2; }
  for (char *s = argv[3]; *s;) {
    int k = (int)strtol(s, &s, 10);
    if (k < 1 || k > 256) { fprintf(stderr, "tcp_yardstick: stream count must be 1..256\n"); return 2; }
    for (int r = 0; r < reps; r++)
      if (run(size, iters, k, call)) return 1;
    if (*s == ',') s++;
  }
  return 0;
}
