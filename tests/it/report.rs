//! `candor report`, `candor merge`, `candor verify` through the binary.
//!
//! The HTML report is rendered in headless Chromium (Debian's `chromium`): the test fails on
//! any console message (the page has no script, so a message means a blocked outside resource
//! or a broken page) and on a chart without a drawn value, and keeps a screenshot in
//! `target/report-test/report.png`. Runs for the report come from the `toy` protocol with
//! `fake:` models and from the authors' recorded outputs scored by Candor (FB-Bench
//! judgements, ReaLMistake detector outputs, Auto-J's pairwise outputs). Sharding and verification use the toy
//! protocol, so they need neither weights nor data.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn candor() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_candor"));
    c.stdin(Stdio::null());
    c
}

fn ok(args: &[&str]) -> Output {
    let out = candor().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "candor {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `candor run toy` of 9 items with `model` as candidate into `out`, then `extra`.
fn toy_args(out: &Path, model: &str, extra: &[&str]) -> Vec<String> {
    let o = out.display().to_string();
    let mut args = vec![
        "run",
        "toy",
        "--model",
        model,
        "--judge",
        "fake:judge",
        "--limit",
        "9",
        "--threads",
        "1",
        "--batch-size",
        "4",
        "--out",
        &o,
    ];
    args.extend_from_slice(extra);
    args.into_iter().map(String::from).collect()
}

fn toy(out: &Path, model: &str, extra: &[&str]) -> Output {
    let args = toy_args(out, model, extra);
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}/{name}: {e}", dir.display()))
}

/// Chromium's binary (`$CHROMIUM`, else `chromium` on PATH), or None (skip, loudly).
fn chromium() -> Option<PathBuf> {
    let name = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(&name))
            .find(|p| p.is_file())
    });
    let found = found.or_else(|| Some(PathBuf::from(&name)).filter(|p| p.is_file()));
    if found.is_none() {
        crate::util::absent(
            crate::util::Need::Chromium,
            "headless Chromium not found (apt-get install chromium, or set $CHROMIUM)",
        );
    }
    found
}

/// Runs headless Chromium on `page` with a fresh profile; returns (stdout, console lines).
fn chromium_run(bin: &Path, page: &Path, extra: &[String]) -> (String, Vec<String>) {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .map(String::from)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

/// What a reader trips over in the charts of `page`, measured by Chromium on a copy of the page
/// with a script added (the page itself has none): text boxes of one chart that overlap or run
/// past its edge, row labels that one chart shows twice, a label broken inside a word, and a κ
/// chart on another axis than κ's.
fn layout_faults(bin: &Path, page: &Path) -> Vec<String> {
    const CHECK: &str = r#"<script>
(function () {
  const faults = [];
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    const cap = svg.parentNode.querySelector('figcaption').textContent;
    const texts = Array.from(svg.querySelectorAll('text'));
    const boxes = texts.map(function (t) { return t.getBoundingClientRect(); });
    const shown = function (t) {
      const spans = t.querySelectorAll('tspan');
      return spans.length ? Array.from(spans).map(function (x) { return x.textContent; }).join(' / ') : t.textContent;
    };
    const frame = svg.getBoundingClientRect();
    for (let i = 0; i < texts.length; i++) {
      const b = boxes[i];
      if (b.left < frame.left - 0.5 || b.right > frame.right + 0.5 || b.top < frame.top - 0.5 || b.bottom > frame.bottom + 0.5) {
        faults.push(cap + ': "' + shown(texts[i]) + '" runs past the chart\'s edge');
      }
    }
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        const a = boxes[i], b = boxes[j];
        const ox = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const oy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (ox > 0.5 && oy > 0.5) {
          faults.push(cap + ': "' + shown(texts[i]) + '" overlaps "' + shown(texts[j]) + '"');
        }
      }
    }
    const seen = new Set();
    svg.querySelectorAll('text.label').forEach(function (t) {
      const v = shown(t);
      if (seen.has(v)) { faults.push(cap + ': the label "' + v + '" twice'); }
      seen.add(v);
    });
    // A label's lines break between words: where a line ends, the full label (its title) has
    // no letter or digit on both sides ("orde / r" and "(consi / stency)" were seen).
    const word = /[\p{L}\p{N}]/u;
    svg.querySelectorAll('text.label').forEach(function (t) {
      const spans = Array.from(t.querySelectorAll('tspan')).map(function (x) { return x.textContent; });
      const title = t.querySelector('title');
      const full = title ? title.textContent : '';
      let from = 0;
      for (let i = 0; i + 1 < spans.length; i++) {
        const tail = spans[i].split('\u2026').pop();
        const at = tail ? full.indexOf(tail, from) : -1;
        if (at < 0) { continue; }
        const end = at + tail.length;
        if (end < full.length && word.test(full[end - 1]) && word.test(full[end])) {
          faults.push(cap + ': the label "' + spans.join(' / ') + '" breaks inside a word');
        }
        from = end;
      }
    });
    // A κ chart has κ's axis (its ticks end at 1), not a percentage's 0-100 where a κ bar is
    // a sliver.
    if (cap.indexOf('\u03ba') >= 0) {
      const ticks = Array.from(svg.querySelectorAll('text.tick')).map(function (x) { return parseFloat(x.textContent); });
      const top = Math.max.apply(null, ticks), bottom = Math.min.apply(null, ticks);
      if (!(top === 1 && bottom >= -1)) {
        faults.push(cap + ': κ drawn on a ' + bottom + ' to ' + top + ' axis');
      }
    }
  });
  const pre = document.createElement('pre');
  pre.id = 'layout-faults';
  pre.textContent = JSON.stringify(faults);
  document.body.appendChild(pre);
})();
</script>"#;
    let html = std::fs::read_to_string(page).unwrap();
    let policy = html
        .find("<meta http-equiv=\"Content-Security-Policy\"")
        .expect("the page's policy");
    let end = policy + html[policy..].find('>').unwrap() + 1;
    let checked = format!("{}{}", &html[..policy], &html[end..])
        .replace("</body>", &format!("{CHECK}</body>"));
    let copy = page.with_file_name("layout-check.html");
    std::fs::write(&copy, checked).unwrap();
    let (dom, console) = chromium_run(bin, &copy, &["--dump-dom".to_string()]);
    assert!(console.is_empty(), "console messages: {console:#?}");
    let json = dom
        .split("<pre id=\"layout-faults\">")
        .nth(1)
        .and_then(|r| r.split("</pre>").next())
        .expect("the check ran");
    let json = json
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

/// The charts of a rendered DOM: (caption, bars drawn).
fn charts(dom: &str) -> Vec<(String, usize)> {
    dom.split("<figure>")
        .skip(1)
        .map(|fig| {
            let caption = fig
                .split("<figcaption>")
                .nth(1)
                .and_then(|c| c.split("</figcaption>").next())
                .unwrap_or("")
                .to_string();
            let svg = fig.split("</svg>").next().unwrap_or("");
            (caption, svg.matches("class=\"bar\"").count())
        })
        .collect()
}

/// A run directory holding only `results.json`, made from recorded outputs scored by Candor
/// (`bench` has the `metrics` and `tables` of a scoring).
fn scored_run(dir: &Path, protocol: &str, label: &str, bench: &serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let results = serde_json::json!({
        "protocol": protocol,
        "models": [{"role": "candidate/0", "name": label, "sha256": ""}],
        "items": bench["metrics"][0]["n"],
        "completed": bench["metrics"][0]["n"],
        "samples": 0,
        "failed": [],
        "metrics": bench["metrics"],
        "tables": bench["tables"],
    });
    std::fs::write(dir.join("results.json"), results.to_string()).unwrap();
}

/// Runs of the published protocols from the authors' recorded outputs (FB-Bench judgements of
/// two models, ReaLMistake detector outputs, Auto-J's Fennec-format pairwise outputs), scored
/// by Candor; empty when the data is absent.
fn recorded_runs(root: &Path) -> Vec<PathBuf> {
    use candor::bench::fbbench::data::load_judgements;
    use candor::bench::fbbench::score::{results, units_from_records, ModelUnits, Rule};
    let mut dirs = Vec::new();
    let Some(fb) = crate::util::shared_file("fbbench/v3/judgments") else {
        return dirs;
    };
    for model in ["gpt-4o-2024-05-13", "gemma-2-9b-it"] {
        let records = load_judgements(&fb.join(format!("{model}.jsonl"))).unwrap();
        let units = ModelUnits {
            model: model.into(),
            units: units_from_records(&records, Rule::Published, false).unwrap(),
        };
        let bench = serde_json::to_value(results(&units, Rule::Published, 0)).unwrap();
        let d = root.join(format!("fbbench-{model}"));
        scored_run(&d, "fbbench", model, &bench);
        dirs.push(d);
    }
    if let Some(outputs) = crate::util::shared_file("realmistake/detector_outputs_open.zip") {
        let json = root.join("rm.json");
        ok(&[
            "score",
            "realmistake",
            "--outputs",
            &outputs.display().to_string(),
            "--out",
            &root.join("rm-perf.json").display().to_string(),
            "--results",
            &json.display().to_string(),
        ]);
        let all: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        for (det, bench) in all.as_object().unwrap().iter().take(3) {
            let d = root.join(format!("realmistake-{det}"));
            scored_run(&d, "realmistake", det, bench);
            dirs.push(d);
        }
    }
    let aj = "fennec/auto-j";
    if let (Some(data), Some(normal), Some(exchanged)) = (
        crate::util::shared_file(&format!("{aj}/testdata_pairwise.jsonl")),
        crate::util::shared_file(&format!("{aj}/pairwise_example_output.jsonl")),
        crate::util::shared_file(&format!("{aj}/pairwise_exchange_example_output.jsonl")),
    ) {
        let json = root.join("fennec.json");
        let p = |x: &PathBuf| x.display().to_string();
        ok(&[
            "score",
            "fennec",
            "--format",
            "auto-j",
            "--data",
            &p(&data),
            "--normal",
            &p(&normal),
            "--exchanged",
            &p(&exchanged),
            "--out",
            &p(&json),
        ]);
        let bench: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let d = root.join("fennec-auto-j");
        scored_run(&d, "fennec", "Auto-J (published outputs)", &bench);
        dirs.push(d);
    }
    dirs
}

/// A run directory of FB-Bench scored on one published judgement (one item).
fn one_item_fbbench(dir: &Path) {
    use candor::bench::fbbench::data::load_judgements;
    use candor::bench::fbbench::score::{results, units_from_records, ModelUnits, Rule};
    let fb = crate::util::shared_file("fbbench/v3/judgments").expect("checked by the caller");
    let mut records = load_judgements(&fb.join("gemma-2-9b-it.jsonl")).unwrap();
    records.truncate(1);
    let units = ModelUnits {
        model: "gemma-2-9b-it".into(),
        units: units_from_records(&records, Rule::Published, false).unwrap(),
    };
    let bench = serde_json::to_value(results(&units, Rule::Published, 0)).unwrap();
    scored_run(dir, "fbbench", "gemma-2-9b-it (one item)", &bench);
}

#[test]
fn report_renders_in_headless_chromium_without_console_errors_or_empty_charts() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    toy(&a, "fake:alpha", &[]);
    toy(&b, "fake:beta", &[]);
    // Each run writes its own report.html too.
    let own = String::from_utf8(read(&a, "report.html")).unwrap();
    assert!(own.contains("fake:alpha (judge fake:judge)"), "{own}");
    let site = tmp.path().join("site");
    let recorded = recorded_runs(tmp.path());
    let mut args = vec![
        "report".to_string(),
        a.display().to_string(),
        b.display().to_string(),
    ];
    args.extend(recorded.iter().map(|d| d.display().to_string()));
    args.extend(["--out".to_string(), site.display().to_string()]);
    let out = candor().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = site.join("index.html");
    let html = std::fs::read_to_string(&page).unwrap();
    for banned in ["<script", "<link", "https://", "@import"] {
        assert!(!html.contains(banned), "the page has {banned:?}");
    }
    if !recorded.is_empty() {
        for p in ["FB-Bench", "ReaLMistake", "Fennec"] {
            assert!(html.contains(&format!("<h2>{p}</h2>")), "no {p} section");
        }
    }
    let Some(bin) = chromium() else {
        return;
    };
    let (dom, console) = chromium_run(&bin, &page, &["--dump-dom".to_string()]);
    assert!(console.is_empty(), "console messages: {console:#?}");
    let found = charts(&dom);
    assert!(found.len() >= 2, "charts in the DOM: {found:?}");
    let empty: Vec<&(String, usize)> = found.iter().filter(|(_, n)| *n == 0).collect();
    assert!(empty.is_empty(), "empty charts: {empty:?}");
    let faults = layout_faults(&bin, &page);
    assert!(faults.is_empty(), "what a reader trips over: {faults:#?}");
    if !recorded.is_empty() {
        // A one-item FB-Bench run: charts whose rows have no value say so on a line of their
        // own, not over the rows' text.
        let one = tmp.path().join("fbbench-one");
        one_item_fbbench(&one);
        let site1 = tmp.path().join("site-one");
        ok(&[
            "report",
            &one.display().to_string(),
            "--out",
            &site1.display().to_string(),
        ]);
        let page1 = site1.join("index.html");
        let faults = layout_faults(&bin, &page1);
        assert!(faults.is_empty(), "one-item run: {faults:#?}");
        let html1 = std::fs::read_to_string(&page1).unwrap();
        eprintln!(
            "one-item FB-Bench page: {} charts say they have no values, no text overlaps",
            html1.matches("no values to draw").count()
        );
    }
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("report-test");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("report.png");
    let _ = std::fs::remove_file(&png);
    let (_, console) = chromium_run(
        &bin,
        &page,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1100,2600".to_string(),
        ],
    );
    assert!(console.is_empty(), "console messages: {console:#?}");
    let shot = std::fs::read(&png).expect("screenshot written");
    assert_eq!(&shot[..8], b"\x89PNG\r\n\x1a\n");
    assert!(shot.len() > 20_000, "screenshot of {} bytes", shot.len());
    eprintln!(
        "report: {} charts, all drawn; screenshot {}",
        found.len(),
        png.display()
    );

    // The layout check can fail: a label broken inside a word and a κ chart on a 0-100 axis
    // (as the page drew them before) are both found.
    let broken = tmp.path().join("broken.html");
    let ticks: String = [0, 25, 50, 75, 100]
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                r##"<text class="tick" x="{}" y="90" font-size="10">{v}</text>"##,
                240 + 80 * i
            )
        })
        .collect();
    std::fs::write(
        &broken,
        format!(
            "<!DOCTYPE html>\n<html><head><meta http-equiv=\"Content-Security-Policy\" \
             content=\"default-src 'none'\"></head><body><figure><figcaption>Agreement (κ)\
             </figcaption><svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" \
             width=\"700\" height=\"100\"><text class=\"label\" x=\"222\" y=\"30\" \
             font-size=\"12\" text-anchor=\"end\"><title>first position preference order\
             </title><tspan x=\"222\" dy=\"0\">first position preference orde</tspan>\
             <tspan x=\"222\" dy=\"14\">r</tspan></text>{ticks}</svg></figure></body></html>\n"
        ),
    )
    .unwrap();
    let faults = layout_faults(&bin, &broken);
    assert!(
        faults.iter().any(|f| f.contains("breaks inside a word"))
            && faults
                .iter()
                .any(|f| f.contains("κ drawn on a 0 to 100 axis")),
        "{faults:#?}"
    );

    // The check can fail: an outside resource under the page's policy is a console message.
    let bad = tmp.path().join("bad.html");
    std::fs::write(
        &bad,
        html.replace("<h1>", "<img src=\"https://example.invalid/x.png\"><h1>"),
    )
    .unwrap();
    let (_, console) = chromium_run(&bin, &bad, &["--dump-dom".to_string()]);
    assert!(
        !console.is_empty(),
        "a blocked image must show in the console"
    );
}

#[test]
fn report_of_an_unfinished_or_missing_run_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("manifest.json"), "{}").unwrap();
    let out = candor()
        .args(["report"])
        .arg(tmp.path())
        .args(["--out"])
        .arg(tmp.path().join("site"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has not finished"), "{err}");
}

#[test]
fn sharded_runs_merge_to_the_unsharded_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    toy(&whole, "fake:alpha", &[]);
    let n = 3;
    let mut dirs = Vec::new();
    for i in 0..n {
        let d = tmp.path().join(format!("shard{i}"));
        toy(&d, "fake:alpha", &["--shard", &format!("{i}/{n}")]);
        let m: serde_json::Value = serde_json::from_slice(&read(&d, "manifest.json")).unwrap();
        assert_eq!(m["identity"]["shard"]["index"], i);
        assert_eq!(m["identity"]["shard"]["count"], n);
        dirs.push(d);
    }
    let merged = tmp.path().join("merged");
    let mut args: Vec<String> = vec!["merge".into()];
    // Any order.
    args.extend(dirs.iter().rev().map(|d| d.display().to_string()));
    args.extend(["--out".into(), merged.display().to_string()]);
    let out = candor().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["samples.jsonl", "results.json", "report.md", "report.html"] {
        assert!(
            read(&whole, name) == read(&merged, name),
            "{name} differs from the unsharded run's"
        );
    }
    // `candor report` reads a merged run, alone and beside the unsharded one.
    let page = tmp.path().join("merged-page");
    ok(&[
        "report",
        &merged.display().to_string(),
        &whole.display().to_string(),
        "--out",
        &page.display().to_string(),
    ]);
    assert!(page.join("index.html").is_file());
    let wm: serde_json::Value = serde_json::from_slice(&read(&whole, "manifest.json")).unwrap();
    let mm: serde_json::Value = serde_json::from_slice(&read(&merged, "manifest.json")).unwrap();
    assert_eq!(wm["identity"], mm["identity"]);

    // A missing shard, a shard twice, and another run's shard are refused.
    let refuse = |dirs: &[&PathBuf], want: &str| {
        let target = tmp.path().join("refused");
        let _ = std::fs::remove_dir_all(&target);
        let out = candor()
            .arg("merge")
            .args(dirs)
            .arg("--out")
            .arg(&target)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{want}: {err}");
    };
    refuse(&[&dirs[0], &dirs[1]], "shards missing: 2/3");
    refuse(&[&dirs[0], &dirs[1], &dirs[1]], "are both shard 1/3");
    let other = tmp.path().join("other2");
    toy(&other, "fake:beta", &["--shard", "2/3"]);
    refuse(&[&dirs[0], &dirs[1], &other], "differ in");
    let unsharded = refuse;
    unsharded(&[&whole], "not a shard");
}

/// `--device cpu,cpu,cpu`: three replicas on shares of the items, merged into the bytes of the
/// one-device run (samples, results, the manifest's identity, and the reports but for their
/// run notes), each device's share in devices.json and the reports' run notes; the same
/// command again resumes and changes nothing else; a list mixing the CPU and a GPU, or one
/// with --shard, is refused.
#[test]
fn device_replicas_write_the_one_device_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    toy(&whole, "fake:alpha", &[]);
    let rep = tmp.path().join("replicas");
    let text = |dir: &Path, name: &str| String::from_utf8(read(dir, name)).unwrap();
    for round in 0..2 {
        toy(&rep, "fake:alpha", &["--device", "cpu,cpu,cpu"]);
        for name in ["samples.jsonl", "results.json"] {
            assert!(
                read(&whole, name) == read(&rep, name),
                "round {round}: {name} differs from the one-device run's"
            );
        }
        // The reports: the one-device run's, and the devices' shares as run notes.
        let (md, one) = (text(&rep, "report.md"), text(&whole, "report.md"));
        let (head, notes) = md
            .split_once("## Run notes\n\n")
            .expect("run notes in report.md");
        assert_eq!(head, one, "round {round}: report.md besides its run notes");
        let lines: Vec<&str> = notes.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 3, "{notes}");
        for (i, l) in lines.iter().enumerate() {
            let want = format!("- replica {i} on cpu (");
            assert!(l.starts_with(&want) && l.contains(": 3 items, "), "{l}");
        }
        let (html, one) = (text(&rep, "report.html"), text(&whole, "report.html"));
        let at = html
            .find("<p>Run notes</p>")
            .expect("run notes in report.html");
        let end = at + html[at..].find("</ul>").unwrap() + "</ul>".len();
        assert_eq!(
            format!("{}{}", &html[..at], &html[end..]),
            one,
            "round {round}: report.html besides its run notes"
        );
        let wm: serde_json::Value = serde_json::from_slice(&read(&whole, "manifest.json")).unwrap();
        let rm: serde_json::Value = serde_json::from_slice(&read(&rep, "manifest.json")).unwrap();
        assert_eq!(wm["identity"], rm["identity"], "round {round}");
        let devices: serde_json::Value =
            serde_json::from_slice(&read(&rep, "devices.json")).unwrap();
        let rows = devices.as_array().expect("a list");
        assert_eq!(rows.len(), 3);
        let items: u64 = rows.iter().map(|r| r["items"].as_u64().unwrap()).sum();
        assert_eq!(items, 9, "{devices}");
        assert!(rows.iter().all(|r| r["device"] == "cpu" && r["items"] == 3));
    }
    let refused = |device: &str, extra: &[&str], want: &str| {
        let out = candor()
            .args([
                "run",
                "toy",
                "--model",
                "fake:alpha",
                "--judge",
                "fake:judge",
            ])
            .args(["--limit", "9", "--device", device, "--out"])
            .arg(tmp.path().join("refused"))
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{device}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{device}: {err}");
    };
    refused(
        "cpu,cpu",
        &["--shard", "0/2"],
        "the replicas are the shards",
    );
    refused("cpu,cuda:0", &[], "mixes the CPU and GPUs");
}

/// Replicas killed mid-run with their parent (SIGKILL to `candor run --device cpu,cpu`): the
/// replicas stop with it, and the same command again resumes them and writes the one-device
/// run's bytes.
#[test]
fn device_replicas_resume_after_the_run_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    toy(&whole, "fake:alpha", &[]);
    let rep = tmp.path().join("replicas");
    let args = |delay: &str| {
        toy_args(
            &rep,
            "fake:alpha",
            &["--device", "cpu,cpu", "--fake-delay-ms", delay],
        )
    };
    let mut child = candor()
        .args(args("500"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once a replica has logged a step.
    let shard_log = tmp.path().join("replicas.shards/0/samples.jsonl");
    let t0 = std::time::Instant::now();
    while std::fs::read(&shard_log).map_or(true, |b| !b.contains(&b'\n')) {
        assert!(t0.elapsed().as_secs() < 60, "no replica logged a step");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !rep.join("results.json").exists(),
        "killed before the merge"
    );
    // The replicas got SIGTERM with their parent: their logs stop growing (a live replica
    // logs a batch every 500 ms).
    let logs = || {
        (0..2)
            .map(|i| {
                let p = tmp
                    .path()
                    .join(format!("replicas.shards/{i}/samples.jsonl"));
                std::fs::metadata(p).map_or(0, |m| m.len())
            })
            .collect::<Vec<_>>()
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = logs();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        logs(),
        before,
        "a replica ran on after its parent was killed"
    );
    // The same command (the delay is one of the shards' recorded arguments).
    let out = candor().args(args("500")).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["samples.jsonl", "results.json"] {
        assert!(
            read(&whole, name) == read(&rep, name),
            "{name} differs from the one-device run's"
        );
    }
    let md = String::from_utf8(read(&rep, "report.md")).unwrap();
    let (head, _notes) = md.split_once("## Run notes\n\n").expect("run notes");
    assert_eq!(head.as_bytes(), read(&whole, "report.md"), "report.md");
}

#[test]
fn verify_recomputes_the_log_and_names_the_first_difference() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    toy(&run, "fake:alpha", &[]);
    let dir = run.display().to_string();
    let out = ok(&["verify", &dir, "--batch-size", "3"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("25 identical, 0 differing"), "{text}");
    let out = ok(&["verify", &dir, "--sample", "5", "--seed", "3"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("verified 5 of 25 steps"));

    // Edit one logged reply: verify names it and fails.
    let log = String::from_utf8(read(&run, "samples.jsonl")).unwrap();
    let line = log.lines().nth(4).unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let text = v["output"]["text"].as_str().unwrap();
    let edited_text = format!("{}X{}", &text[..8], &text[9..]);
    let edited = log.replacen(
        &serde_json::to_string(text).unwrap(),
        &serde_json::to_string(&edited_text).unwrap(),
        1,
    );
    assert_ne!(edited, log);
    std::fs::write(run.join("samples.jsonl"), edited).unwrap();
    let out = candor().args(["verify", &dir]).output().unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let item = v["item"].as_str().unwrap();
    assert!(stdout.contains(&format!("DIFFERS {item}")), "{stdout}");
    assert!(
        stdout.contains("first difference at character 8"),
        "{stdout}"
    );
    assert!(stdout.contains("24 identical, 1 differing"), "{stdout}");
}

/// Whether a Slurm cluster answers here (`sinfo` runs and lists a node), else skip loudly.
fn slurm_cluster() -> bool {
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%t"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if !up {
        crate::util::absent(
            crate::util::Need::Slurm,
            "no Slurm cluster answers here (sinfo); a single-node one: \
             bash tests/fixtures/slurm/single-node.sh",
        );
    }
    up
}

#[test]
fn slurm_launch_runs_shards_then_merge() {
    if !slurm_cluster() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    toy(&whole, "fake:alpha", &[]);
    let out = tmp.path().join("slurm-run");
    let work = tmp.path().display().to_string();
    let o = out.display().to_string();
    let script = ok(&[
        "launch",
        "slurm",
        "--shards",
        "3",
        "--cpus",
        "1",
        "--mem",
        "500M",
        "--workdir",
        &work,
        "--candor",
        env!("CARGO_BIN_EXE_candor"),
        "--",
        "toy",
        "--model",
        "fake:alpha",
        "--judge",
        "fake:judge",
        "--limit",
        "9",
        "--batch-size",
        "4",
        "--out",
        &o,
    ])
    .stdout;
    let path = tmp.path().join("submit.sh");
    std::fs::write(&path, &script).unwrap();
    let submitted = Command::new("bash").arg(&path).output().unwrap();
    let said = String::from_utf8_lossy(&submitted.stdout).into_owned();
    assert!(
        submitted.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    eprintln!("{said}");
    let start = std::time::Instant::now();
    let logs = tmp.path().join("slurm-run.shards/logs");
    let merge_done = || {
        std::fs::read_to_string(logs.join("merge.out"))
            .is_ok_and(|t| t.contains("merged 3 shards") || t.contains("error"))
    };
    while !merge_done() {
        assert!(
            start.elapsed().as_secs() < 180,
            "the Slurm jobs did not finish in 3 minutes; logs in {}: {:?}",
            logs.display(),
            std::fs::read_to_string(logs.join("merge.out"))
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    for name in ["samples.jsonl", "results.json", "report.md", "report.html"] {
        assert!(
            read(&whole, name) == read(&out, name),
            "{name}: the Slurm merge differs from the unsharded run"
        );
    }
    for i in 0..3 {
        assert!(logs.join(format!("shard-{i}.out")).is_file());
    }
    let merge_log = std::fs::read_to_string(logs.join("merge.out")).unwrap_or_default();
    eprintln!("slurm merge log:\n{merge_log}");
    assert!(merge_log.contains("merged 3 shards"), "{merge_log}");
}

#[test]
fn generation_cache_is_shared_by_concurrent_processes_and_reused_by_a_new_judge() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache").display().to_string();
    let args = |out: &Path, judge: &str| -> Vec<String> {
        [
            "run",
            "toy",
            "--model",
            "fake:alpha",
            "--judge",
            judge,
            "--limit",
            "9",
            "--threads",
            "1",
            "--batch-size",
            "2",
            "--cache-dir",
            &cache,
            "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([out.display().to_string()])
        .collect()
    };
    // Two processes fill one cache at once.
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let pa = candor().args(args(&a, "fake:judge")).spawn().unwrap();
    let pb = candor().args(args(&b, "fake:judge")).spawn().unwrap();
    for p in [pa, pb] {
        assert!(p.wait_with_output().unwrap().status.success());
    }
    assert!(read(&a, "samples.jsonl") == read(&b, "samples.jsonl"));
    // Every entry is whole JSON (no torn or temporary files).
    let mut entries = 0;
    for d in std::fs::read_dir(tmp.path().join("cache")).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            let f = f.unwrap().path();
            assert_eq!(
                f.extension().and_then(|e| e.to_str()),
                Some("json"),
                "{f:?}"
            );
            let _: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap())
                .unwrap_or_else(|e| panic!("{f:?}: {e}"));
            entries += 1;
        }
    }
    // 9 items: 16 candidate replies (one item is refused at its first turn) and 8 judgements.
    assert_eq!(entries, 24);
    // Another judge: the candidate replies come from the cache, byte for byte.
    let c = tmp.path().join("c");
    let out = candor().args(args(&c, "fake:other")).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("16 replies reused, 8 stored"), "{err}");
    let candidate_lines = |d: &Path| -> Vec<String> {
        String::from_utf8(read(d, "samples.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"actor\":{\"candidate\":0}"))
            .map(String::from)
            .collect()
    };
    assert_eq!(candidate_lines(&a), candidate_lines(&c));
    // Deleting the cache only costs recomputation.
    std::fs::remove_dir_all(tmp.path().join("cache")).unwrap();
    let d = tmp.path().join("d");
    let out = candor().args(args(&d, "fake:judge")).output().unwrap();
    assert!(out.status.success());
    assert!(read(&a, "samples.jsonl") == read(&d, "samples.jsonl"));
}
