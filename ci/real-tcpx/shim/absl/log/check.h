// CHECK and CHECK_EQ for abseil releases older than 20230125, which have no absl/log (Debian 12
// ships 20220623). GPUDirect-TCPX uses these two macros only; a failed check aborts, as abseil's
// does. Part of tcpx-lab's build of the plugin (ci/real-tcpx/build.sh), not of the plugin.
#ifndef TCPX_LAB_ABSL_LOG_CHECK_SHIM_H_
#define TCPX_LAB_ABSL_LOG_CHECK_SHIM_H_

#include <cstdio>
#include <cstdlib>
// abseil's check.h brings in <sstream> through its log message streams, and the plugin's code
// uses std::stringstream relying on that.
#include <sstream>

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

#define CHECK_EQ(a, b) CHECK((a) == (b))

#endif  // TCPX_LAB_ABSL_LOG_CHECK_SHIM_H_
