//! Where results go when the asked-for directory cannot take them: checked before a run, and a
//! temporary directory (named in the result) when writing fails at the end.

mod common;

use std::path::Path;

#[test]
fn an_unwritable_run_directory_is_refused_up_front_with_the_flag_to_change() {
    let e = tcpx_report::prepare_run_dir(Path::new("/dev/null/reports/run"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/dev/null/reports/run") && e.contains("--reports"),
        "{e}"
    );
    let ok = tempfile::tempdir().unwrap();
    let dir = ok.path().join("a/b");
    tcpx_report::prepare_run_dir(&dir).unwrap();
    // The probe file is gone again: the directory is left empty.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn a_report_that_cannot_be_written_where_asked_goes_to_a_temporary_directory() {
    let report = common::report(false);
    let wanted = Path::new("/dev/null/reports/20261123T000000Z-p");
    let saved = tcpx_report::write_run_or_fallback(&report, wanted).unwrap();
    let why = saved.fallback_reason.expect("the fallback was used");
    assert!(why.contains("/dev/null/reports"), "{why}");
    let dir = saved.written.dir.clone();
    assert!(dir.starts_with(std::env::temp_dir()), "{}", dir.display());
    let back = tcpx_report::load_run(&dir).unwrap();
    assert_eq!(
        (back.plan.as_str(), back.records.len()),
        (report.plan.as_str(), report.records.len())
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let ok = tempfile::tempdir().unwrap();
    let saved = tcpx_report::write_run_or_fallback(&report, ok.path()).unwrap();
    assert!(saved.fallback_reason.is_none());
    assert_eq!(saved.written.dir, ok.path());
}

#[test]
fn a_directory_or_device_is_not_a_writable_file() {
    let d = tempfile::tempdir().unwrap();
    let e = tcpx_report::check_writable_file(d.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("is a directory"), "{e}");
    let e = tcpx_report::check_writable_file(Path::new("/dev/full"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a regular file"), "{e}");
    tcpx_report::check_writable_file(&d.path().join("new/x.csv")).unwrap();
}
