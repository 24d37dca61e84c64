//! tcpx-test-plugin: a working NCCL net plugin for tests (being written).
