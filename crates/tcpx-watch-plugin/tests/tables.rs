//! The shim's exported tables driven in process the way NCCL drives them, in front of the
//! workspace's test plugin (net API v7): a v7 caller through `ncclNetPlugin_v7`, the v8 and v9
//! tables' properties served from the v7 plugin as NCCL's compatibility layer serves them, the
//! real plugin's NULL entries mirrored at init, and every line the shim writes read back by
//! `tcpx_watch::record` (the contract's reader).
//!
//! One test: the shim is initialised once per process, as NCCL initialises a net plugin once.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::{addr_of, null_mut};
use std::time::{Duration, Instant};

use tcpx_ffi::abi::*;
use tcpx_watch::record::{ConnCall, Dir, Record};
use tcpx_watch_plugin::{ncclNetPlugin_v7, ncclNetPlugin_v8, ncclNetPlugin_v9};

fn ok(code: NcclResult, what: &str) {
    assert_eq!(
        code,
        NCCL_SUCCESS,
        "{what} answered {}",
        result_c_name(code)
    );
}

#[test]
fn a_v7_caller_moves_bytes_through_the_shim_and_every_line_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let watch = dir.path().join("watch");
    std::env::set_var("TCPX_WATCH_INNER", tcpx_test_support::test_plugin_so());
    std::env::set_var("TCPX_WATCH_DIR", &watch);
    // Long enough that only this test's own flush writes intervals.
    std::env::set_var("TCPX_WATCH_INTERVAL_MS", "60000");
    std::env::set_var("TCPX_TEST_PLUGIN_MODE", "host");
    std::env::remove_var("TCPX_TEST_PLUGIN_FAULT");

    // SAFETY: the tables are only written by the shim's init, which runs on this thread below;
    // the references are re-taken after it.
    let before = unsafe { (*addr_of!(ncclNetPlugin_v7)).iflush.is_some() };
    assert!(before, "before init every entry is the shim's own");
    // SAFETY: init with no logger is allowed (the plugin then logs nothing).
    ok(
        unsafe { (*addr_of!(ncclNetPlugin_v7)).init.unwrap()(None) },
        "init",
    );
    // SAFETY: init is done; nothing writes the tables any more.
    let (t7, t8, t9) = unsafe {
        (
            &*addr_of!(ncclNetPlugin_v7),
            &*addr_of!(ncclNetPlugin_v8),
            &*addr_of!(ncclNetPlugin_v9),
        )
    };
    // The test plugin has no regMrDmaBuf, iflush or getDeviceMr, and no makeVDevice (v7): NCCL
    // must see the same NULLs through the shim.
    for (name, missing) in [
        ("v7 iflush", t7.iflush.is_none()),
        ("v7 regMrDmaBuf", t7.reg_mr_dma_buf.is_none()),
        ("v7 getDeviceMr", t7.get_device_mr.is_none()),
        ("v8 iflush", t8.iflush.is_none()),
        ("v9 iflush", t9.iflush.is_none()),
        ("v9 makeVDevice", t9.make_v_device.is_none()),
    ] {
        assert!(missing, "{name} should be NULL like the real plugin's");
    }
    assert!(t7.irecv_consumed.is_some() && t9.test.is_some());

    // Properties: the v7 plugin's, widened for v8/v9 callers as NCCL's compat layer does.
    // SAFETY (this block): all-zero properties are valid out values; entries are the shim's.
    unsafe {
        let mut p7: NetPropertiesV7 = std::mem::zeroed();
        ok(t7.get_properties.unwrap()(0, &mut p7), "getProperties v7");
        assert_eq!(CStr::from_ptr(p7.name).to_str().unwrap(), "lo");
        let mut p8: NetPropertiesV8 = std::mem::zeroed();
        ok(t8.get_properties.unwrap()(0, &mut p8), "getProperties v8");
        assert_eq!(
            (p8.speed, p8.max_comms, p8.reg_is_global),
            (p7.speed, p7.max_comms, 0)
        );
        let mut p9: NetPropertiesV9 = std::mem::zeroed();
        ok(t9.get_properties.unwrap()(0, &mut p9), "getProperties v9");
        assert_eq!(p9.pci_path, p7.pci_path);
        assert_eq!((p9.v_props.ndevs, p9.v_props.devs[0]), (1, 0));
        assert_eq!(p9.max_p2p_bytes, tcpx_watch_plugin::MAX_NET_SIZE);
        assert_eq!(p9.force_flush, 0);
        assert_ne!(t7.get_properties.unwrap()(5, &mut p7), NCCL_SUCCESS);
    }

    // Set-up as NCCL does it: listen, then connect and accept retried until each has a comm.
    let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    let mut listen: *mut c_void = null_mut();
    // SAFETY: a 128-byte handle and an out pointer.
    ok(
        unsafe { t7.listen.unwrap()(0, handle.as_mut_ptr().cast(), &mut listen) },
        "listen",
    );
    let mut peer_handle = handle; // what travels to the connecting peer
    let (mut send, mut recv): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    let mut dev_handle = NetDeviceHandle::zeroed();
    let mut dev_ptr: *mut NetDeviceHandle = &mut dev_handle;
    let deadline = Instant::now() + Duration::from_secs(30);
    while send.is_null() || recv.is_null() {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_null() {
            let mut unused: *mut NetDeviceHandle = null_mut();
            // SAFETY: the handle from listen, out pointers we own.
            ok(
                unsafe {
                    t7.connect.unwrap()(0, peer_handle.as_mut_ptr().cast(), &mut send, &mut unused)
                },
                "connect",
            );
        }
        if recv.is_null() {
            // SAFETY: the listen comm from the shim, out pointers we own.
            ok(
                unsafe { t7.accept.unwrap()(listen, &mut recv, &mut dev_ptr) },
                "accept",
            );
        }
    }

    // Three messages, posted and tested as NCCL's proxy does (v7: int sizes).
    let len = 100_000usize;
    let src: Vec<u8> = (0..3 * len).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; 3 * len];
    let (mut smr, mut rmr): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    // SAFETY: buffers that outlive their registrations.
    unsafe {
        ok(
            t7.reg_mr.unwrap()(
                send,
                src.as_ptr() as *mut c_void,
                src.len() as c_int,
                NCCL_PTR_HOST,
                &mut smr,
            ),
            "regMr send",
        );
        ok(
            t7.reg_mr.unwrap()(
                recv,
                dst.as_mut_ptr().cast(),
                dst.len() as c_int,
                NCCL_PTR_HOST,
                &mut rmr,
            ),
            "regMr recv",
        );
    }
    for k in 0..3 {
        let (mut sreq, mut rreq): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let mut data: *mut c_void = dst[k * len..].as_mut_ptr().cast();
        let (mut size, mut tag, mut mh) = (len as c_int, 0 as c_int, rmr);
        // SAFETY: registered ranges, out pointers we own, n = 1.
        unsafe {
            ok(
                t7.irecv.unwrap()(recv, 1, &mut data, &mut size, &mut tag, &mut mh, &mut rreq),
                "irecv",
            );
            ok(
                t7.isend.unwrap()(
                    send,
                    src[k * len..].as_ptr() as *mut c_void,
                    len as c_int,
                    0,
                    smr,
                    &mut sreq,
                ),
                "isend",
            );
        }
        assert!(!sreq.is_null() && !rreq.is_null());
        for (req, what) in [(sreq, "send"), (rreq, "recv")] {
            let (mut done, mut got) = (0 as c_int, -7 as c_int);
            while done == 0 {
                assert!(Instant::now() < deadline, "{what} {k} did not complete");
                // SAFETY: a request the shim handed out, out values we own.
                ok(
                    unsafe { t7.test.unwrap()(req, &mut done, &mut got) },
                    "test",
                );
            }
            assert_eq!(
                got, len as c_int,
                "{what} {k}: the plugin's size reaches the caller"
            );
        }
    }
    assert_eq!(src, dst, "bytes arrive unchanged through the shim");
    tcpx_watch_plugin::flush_now();

    // Every line reads back with the contract's reader.
    let file = std::fs::read_dir(&watch)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .expect("the shim's file");
    let text = std::fs::read_to_string(&file).unwrap();
    let records: Vec<Record> = text
        .lines()
        .map(|l| Record::parse(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let Record::Start(start) = &records[0] else {
        panic!("first line: {:?}", records[0])
    };
    assert_eq!(
        (start.api, start.inner_name.as_str()),
        (7, "tcpx-test-plugin")
    );
    assert_eq!(start.devices[0].name, "lo");
    let conns: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Conn(c) => Some(c),
            _ => None,
        })
        .collect();
    let link_of = |call: ConnCall| {
        conns
            .iter()
            .find(|c| c.call == call && c.ok)
            .map(|c| c.link.clone())
            .unwrap_or_else(|| panic!("no {call:?} line: {conns:?}"))
    };
    let link = link_of(ConnCall::Listen);
    assert_eq!(
        link_of(ConnCall::Connect),
        link,
        "the connector's link is the listener's"
    );
    assert_eq!(link_of(ConnCall::Accept), link);
    let Some(Record::Interval(last)) = records
        .iter()
        .rev()
        .find(|r| matches!(r, Record::Interval(_)))
    else {
        panic!("no interval: {text}")
    };
    assert_eq!(last.comms.len(), 2, "{last:?}");
    for c in &last.comms {
        assert_eq!(
            (c.bytes, c.requests, c.inflight),
            (3 * len as u64, 3, 0),
            "{c:?}"
        );
        assert_eq!(c.link, link);
        assert_eq!(c.lat_us.problem(), None);
        assert_eq!(c.lat_us.total(), 3);
    }
    assert!(last.comms.iter().any(|c| c.dir == Dir::Send));
    assert!(last.comms.iter().any(|c| c.dir == Dir::Recv));

    // Closing passes through.
    // SAFETY: the shim's comms and registrations, each closed once.
    unsafe {
        ok(t7.dereg_mr.unwrap()(send, smr), "deregMr send");
        ok(t7.dereg_mr.unwrap()(recv, rmr), "deregMr recv");
        ok(t7.close_send.unwrap()(send), "closeSend");
        ok(t7.close_recv.unwrap()(recv), "closeRecv");
        ok(t7.close_listen.unwrap()(listen), "closeListen");
    }
}
