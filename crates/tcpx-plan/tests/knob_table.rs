//! The knob table against the ways a value comes in: every knob reaches what acts on it from
//! the command line (the flags' values as `tcpx-run bench` hands them on, `ExperimentFlags`),
//! from a plan (`PlanExperiment::set`) and in the CSV; and a knob's range is the same for the
//! command line and a plan. A table row without its field and its use, or a range one way in
//! checks differently, fails here. (That the command line has every flag, with the table's
//! variable and default, is `tcpx-run`'s own test.)

use tcpx_bench::flags::ExperimentFlags;
use tcpx_plan::knobs::PlanExperiment;

/// A value for a knob that is not its default and that its kind accepts, as text.
fn sample_value(spec: &tcpx_model::KnobSpec, kind: tcpx_model::KnobKind) -> String {
    use tcpx_model::KnobKind;
    match kind {
        KnobKind::Int { min, .. } | KnobKind::OptInt { min, .. } => (min + 2).to_string(),
        KnobKind::Size { min, .. }
        | KnobKind::OptSize { min, .. }
        | KnobKind::Sizes { min, .. } => min.max(4096).saturating_mul(3).to_string(),
        KnobKind::Float { min, .. } => (min + 2.5).to_string(),
        KnobKind::Bool => (spec.default != "true").to_string(),
        KnobKind::Choice(words) => words
            .iter()
            .find(|w| **w != spec.default)
            .expect("a choice has a second word")
            .to_string(),
        KnobKind::Text => "sample".into(),
        KnobKind::Memory => "cuda:0,1".into(),
        KnobKind::Cpus => "0-1".into(),
        KnobKind::Settings => "SAMPLE_VAR=1".into(),
        KnobKind::Names => "eth9".into(),
    }
}

/// Every knob of the table reaches what acts on it from each way in it declares: its flag
/// sets the experiment's value, a plan setting it changes the bench experiment, what runs
/// outside the bench or the plan's own bookkeeping, and its CSV column shows it. A table
/// entry without its use fails here.
#[test]
fn every_knob_is_reachable_from_the_command_line_the_plan_api_and_csv() {
    use tcpx_model::{Experiment, KnobKind, KNOBS};
    // Knobs the plan keeps itself (`PlanExperiment`): the label, repetitions and the plugin's
    // chunk (into the bench's variables, for netplugin), and `size`, written as `sizes`.
    const PLAN_OWN: &[tcpx_model::Knob] = &[
        tcpx_model::Knob::Label,
        tcpx_model::Knob::Repeat,
        tcpx_model::Knob::PluginChunk,
        tcpx_model::Knob::Size,
    ];
    for spec in KNOBS {
        let k = spec.knob;
        if let Some(flag) = spec.flag {
            let value = sample_value(spec, spec.flag_kind());
            // What the command line hands on for the flag: a switch its word, a knob that is
            // on or off `on`/`off`, any other the value as given.
            let given = match (spec.switch, spec.flag_kind()) {
                (Some(on), _) => on.to_string(),
                (None, KnobKind::Bool) => if value == "true" { "on" } else { "off" }.to_string(),
                (None, _) => value.clone(),
            };
            let exp = ExperimentFlags::default()
                .with(k, &given)
                .experiment()
                .unwrap_or_else(|e| panic!("--{flag} {given}: {e}"));
            let got = exp
                .get_knob(k)
                .unwrap_or_else(|| panic!("--{flag}: the experiment has no place for {k}"));
            let want = spec.switch.map_or_else(|| value.clone(), str::to_string);
            assert_eq!(got, [want], "--{flag} does not reach the experiment's {k}");
            assert_ne!(
                exp.get_knob(k),
                Experiment::default().get_knob(k),
                "--{flag}: {value} is the default, so the test shows nothing"
            );
        }
        if spec.in_plan && !PLAN_OWN.contains(&k) {
            let json: serde_json::Value = match spec.kind {
                KnobKind::Int { .. }
                | KnobKind::OptInt { .. }
                | KnobKind::Size { .. }
                | KnobKind::OptSize { .. } => {
                    serde_json::json!(sample_value(spec, spec.kind).parse::<u64>().unwrap())
                }
                KnobKind::Sizes { .. } => {
                    serde_json::json!([sample_value(spec, spec.kind).parse::<u64>().unwrap()])
                }
                KnobKind::Float { .. } => {
                    serde_json::json!(sample_value(spec, spec.kind).parse::<f64>().unwrap())
                }
                KnobKind::Bool => serde_json::json!(spec.default != "true"),
                _ => serde_json::json!(sample_value(spec, spec.kind)),
            };
            let base = PlanExperiment::defaults();
            let mut p = base.clone();
            p.set(spec.name, &json)
                .unwrap_or_else(|e| panic!("{k} = {json}: {e}"));
            let moved = |b: &PlanExperiment| (b.bench.get_knob(k), b.outside.get_knob(k));
            let (bench, outside) = moved(&p);
            assert!(
                bench.is_some() || outside.is_some(),
                "plan knob {k} reaches neither the bench experiment nor the outside knobs"
            );
            assert_ne!(
                moved(&p),
                moved(&base),
                "plan knob {k} = {json} changes nothing"
            );
        }
        if let Some(column) = spec.csv {
            let i = tcpx_bench::csv::CSV_HEADER
                .iter()
                .position(|c| *c == column)
                .unwrap_or_else(|| panic!("{k}'s column {column} is not in the CSV"));
            let mut e = Experiment::default();
            if let Some(flag_kind) = spec.flag.map(|_| spec.flag_kind()) {
                e.set_knob(k, &[sample_value(spec, flag_kind)]).unwrap();
            }
            let size = e.sizes[0];
            let side = |side: tcpx_bench::Side| {
                serde_json::from_value::<tcpx_bench::SideResult>(serde_json::json!({
                    "side": side,
                    "iter_secs": [0.001],
                }))
                .unwrap()
                .summarise(size)
            };
            let m = tcpx_bench::Measurement {
                size,
                chunk: e.chunk_for(size),
                experiment: e.clone(),
                send: side(tcpx_bench::Side::Send),
                recv: side(tcpx_bench::Side::Recv),
            };
            let rows = tcpx_bench::csv::csv_rows(&m, "local", "loopback", 0);
            let text = e.get_knob(k).map(|v| v.join(",")).unwrap_or_default();
            assert_eq!(rows[0][i], text, "{k}'s column {column}");
        }
    }
}

/// A knob's range is the knob table's wherever a value comes in: for every row that both
/// the command line and a plan set, a value just outside each bound is refused by both and
/// one at each bound is accepted by both (checked as far as the run would: flags through
/// `BenchArgs::experiment`, a plan's value through `PlanExperiment::set` and the bench
/// experiment's `validate`). `nics` is left out: a plan gives a count, the command line
/// this side's NIC names.
#[test]
fn the_command_line_and_a_plan_accept_the_same_range_for_every_knob() {
    use serde_json::json;
    use tcpx_model::{KnobKind, KNOBS};
    /// Other knobs a value needs to be judged alone: a message it fits, a ring a chunk fits.
    fn context(k: tcpx_model::Knob, v: &str) -> Vec<(&'static str, String)> {
        use tcpx_model::Knob;
        match k {
            Knob::Chunk => {
                let size = v.parse::<u64>().unwrap_or(1).clamp(1, 1 << 30);
                vec![("size", size.to_string())]
            }
            Knob::StagingRing => vec![("size", (64u64 << 10).to_string())],
            _ => Vec::new(),
        }
    }
    let mut compared = 0;
    for spec in KNOBS {
        let (Some(flag), true) = (spec.flag, spec.in_plan) else {
            continue;
        };
        if spec.flag_kind.is_some() || !spec.kind.has_range() {
            continue;
        }
        // (text for the flag, JSON for the plan, inside the range)
        let cases: Vec<(String, serde_json::Value, bool)> = match spec.kind {
            KnobKind::Int { min, max } | KnobKind::OptInt { min, max } => {
                [(min - 1, false), (min, true), (max, true), (max + 1, false)]
                    .into_iter()
                    .map(|(v, inside)| (v.to_string(), json!(v), inside))
                    .collect()
            }
            KnobKind::Size { min, max }
            | KnobKind::OptSize { min, max }
            | KnobKind::Sizes { min, max } => {
                [(min - 1, false), (min, true), (max, true), (max + 1, false)]
                    .into_iter()
                    .map(|(v, inside)| {
                        let plan = if matches!(spec.kind, KnobKind::Sizes { .. }) {
                            json!([v])
                        } else {
                            json!(v)
                        };
                        (v.to_string(), plan, inside)
                    })
                    .collect()
            }
            KnobKind::Float { min, max } => [
                (min / 2.0, false),
                (min, true),
                (max, true),
                (max + 1.0, false),
            ]
            .into_iter()
            .map(|(v, inside)| (v.to_string(), json!(v), inside))
            .collect(),
            _ => unreachable!("has_range"),
        };
        for (text, plan_value, inside) in cases {
            let ctx = context(spec.knob, &text);
            // As `tcpx-run bench` takes its flags: every value as text, then the checks
            // across knobs.
            let mut flags = ExperimentFlags::default();
            for (k, v) in &ctx {
                let by_flag = KNOBS.iter().find(|s| s.flag == Some(*k)).unwrap();
                flags = flags.with(by_flag.knob, v);
            }
            let cli = flags
                .with(spec.knob, &text)
                .experiment()
                .and_then(|e| e.validate(None).map(|()| e));
            let mut p = PlanExperiment::defaults();
            let plan = ctx
                .iter()
                .try_for_each(|(k, v)| p.set(k, &json!(v.parse::<u64>().unwrap())))
                .and_then(|()| p.set(spec.name, &plan_value))
                .map_err(|e| e.to_string())
                .and_then(|()| p.bench_to_run().validate(None));
            assert_eq!(
                cli.is_ok(),
                inside,
                "--{flag} {text} (range {}): the command line says {:?}",
                spec.kind.range_text().unwrap(),
                cli.as_ref().map(|_| ())
            );
            assert_eq!(
                plan.is_ok(),
                inside,
                "{} = {plan_value} (range {}): the plan says {plan:?}",
                spec.name,
                spec.kind.range_text().unwrap()
            );
        }
        compared += 1;
    }
    assert!(compared >= 10, "only {compared} knobs compared");
}
