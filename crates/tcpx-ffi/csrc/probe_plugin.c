/* A minimal NCCL net plugin for tcpx-ffi's own tests: it exports the tables of the ABI versions
 * selected at compile time (PROBE_V9 / PROBE_V8 / PROBE_V7), each with init, devices and
 * getProperties only. The structs are written from NCCL's ext-net header layouts, so a C compiler
 * lays them out and the Rust side reads them back: a cross-check of the repr(C) mirrors. */
#include <stddef.h>
#include <stdint.h>

typedef void (*logger_t)(int, unsigned long, const char *, int, const char *, ...);

typedef struct {
  char *name; char *pciPath; uint64_t guid; int ptrSupport; int speed; int port; float latency;
  int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
} props_v7;

typedef struct {
  char *name; char *pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int speed; int port;
  float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
} props_v8;

typedef struct { int ndevs; int devs[4]; } vprops_v9;

typedef struct {
  char *name; char *pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; int netDeviceType;
  int netDeviceVersion; vprops_v9 vProps; size_t maxP2pBytes; size_t maxCollBytes;
} props_v9;

#define FN void *
typedef struct {
  const char *name;
  int (*init)(logger_t);
  int (*devices)(int *);
  FN getProperties;
  FN rest[15]; /* listen .. irecvConsumed: NULL */
} table_v7_v8;

typedef struct {
  const char *name;
  int (*init)(logger_t);
  int (*devices)(int *);
  FN getProperties;
  FN rest[16]; /* listen .. makeVDevice: NULL */
} table_v9;

/* No log line here: the logger's own unit test captures lines in the same test process. */
static int init(logger_t l) {
  (void)l;
  return 0;
}
static int devices(int *n) { *n = 2; return 0; }

static int props7(int dev, props_v7 *p) {
  p->name = "probe7"; p->pciPath = "/sys/probe"; p->guid = 0x1122334455667788ull + dev;
  p->ptrSupport = 3; p->speed = 200000; p->port = 7; p->latency = 1.5f; p->maxComms = 77;
  p->maxRecvs = 1; p->netDeviceType = 1; p->netDeviceVersion = 7;
  return 0;
}
static int props8(int dev, props_v8 *p) {
  p->name = "probe8"; p->pciPath = "/sys/probe"; p->guid = 0x1122334455667788ull + dev;
  p->ptrSupport = 3; p->regIsGlobal = 1; p->speed = 200000; p->port = 8; p->latency = 2.5f;
  p->maxComms = 88; p->maxRecvs = 8; p->netDeviceType = 1; p->netDeviceVersion = 7;
  return 0;
}
static int props9(int dev, props_v9 *p) {
  p->name = "probe9"; p->pciPath = "/sys/probe"; p->guid = 0x1122334455667788ull + dev;
  p->ptrSupport = 3; p->regIsGlobal = 1; p->forceFlush = 1; p->speed = 400000; p->port = 9;
  p->latency = 3.5f; p->maxComms = 99; p->maxRecvs = 9; p->netDeviceType = 0;
  p->netDeviceVersion = 0; p->vProps.ndevs = 1; p->vProps.devs[0] = dev;
  p->maxP2pBytes = (size_t)1 << 31; p->maxCollBytes = (size_t)1 << 30;
  return 0;
}

#if defined(PROBE_V7) || defined(PROBE_V8) || defined(PROBE_V9)
table_v7_v8 ncclNetPlugin_v7 = {"probe_v7", init, devices, (FN)props7, {0}};
#endif
#if defined(PROBE_V8) || defined(PROBE_V9)
table_v7_v8 ncclNetPlugin_v8 = {"probe_v8", init, devices, (FN)props8, {0}};
#endif
#if defined(PROBE_V9)
table_v9 ncclNetPlugin_v9 = {"probe_v9", init, devices, (FN)props9, {0}};
#endif
