//! The one rule for a test that finds something it needs absent: skip it loudly and count it,
//! or fail.
//!
//! What CI provides (the authors' public data, the default model, the committed fixtures,
//! headless Chromium, NVRTC for the CUDA tests) is a failure when absent under `CI=true`; a
//! GPU is a failure when `CANDOR_REQUIRE_GPU=1`; what a machine may legitimately lack (a GPU,
//! AVX-512, a Slurm cluster, `/proc`, an optional reference file) is never one. A skipped check
//! still shows as `ok` in libtest's list, so each is recorded: printed at once, listed with a
//! count when the test binary exits (after libtest's `test result:` line), and appended to
//! the file named by `CANDOR_SKIP_LOG` when it is set (one tab-separated line per skip:
//! need, test, source location, reason), which `.ci/run` prints at its end. Test support only:
//! compiled for the unit tests and with the `testkit` feature, never into a release build.

use std::fmt;
use std::io::Write;
use std::panic::Location;
use std::sync::{Mutex, Once};

/// What a test needs and may find absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The authors' public data (`$CANDOR_DATA`, default `../shared/data`).
    Data,
    /// The default model (`cargo run -- setup`).
    Model,
    /// A file committed under `tests/fixtures/`.
    Fixture,
    /// Headless Chromium (`apt-get install chromium` or `$CHROMIUM`).
    Chromium,
    /// A loadable `libnvrtc` (the CUDA tests; `.ci/run` fetches one from PyPI).
    Nvrtc,
    /// A usable GPU (`CANDOR_REQUIRE_GPU=1` makes its absence a failure).
    Gpu,
    /// A CPU feature (AVX2, AVX-512, VNNI) whose kernels a test compares.
    CpuFeature,
    /// A Slurm cluster answering `sinfo`.
    Slurm,
    /// An operating-system facility (`/proc/self/status`).
    Os,
    /// An optional reference file of a test that is run only when asked for.
    Reference,
}

impl Need {
    /// Whether `.ci/run` provides it, so that its absence under `CI=true` is a failure.
    pub fn provided_by_ci(self) -> bool {
        matches!(
            self,
            Need::Data | Need::Model | Need::Fixture | Need::Chromium | Need::Nvrtc
        )
    }

    /// A short name for listings.
    pub fn label(self) -> &'static str {
        match self {
            Need::Data => "data",
            Need::Model => "model",
            Need::Fixture => "fixture",
            Need::Chromium => "chromium",
            Need::Nvrtc => "nvrtc",
            Need::Gpu => "gpu",
            Need::CpuFeature => "cpu-feature",
            Need::Slurm => "slurm",
            Need::Os => "os",
            Need::Reference => "reference",
        }
    }
}

/// What the rule decides for one absence.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Skip,
    /// Fail, with the reason appended to the message.
    Fail(&'static str),
}

fn decide(need: Need, ci: bool, require_gpu: bool) -> Verdict {
    if need == Need::Gpu && require_gpu {
        Verdict::Fail("CANDOR_REQUIRE_GPU=1 but the GPU cannot be used")
    } else if ci && need.provided_by_ci() {
        Verdict::Fail("under CI=true this is a failure")
    } else {
        Verdict::Skip
    }
}

/// One skipped check.
#[derive(Clone, Debug)]
pub struct Skip {
    pub need: Need,
    /// The test (libtest names its thread after it), else the thread's name.
    pub test: String,
    /// Where the skip was decided (`file:line`).
    pub location: String,
    pub why: String,
}

impl Skip {
    fn tsv(&self) -> String {
        let clean = |s: &str| s.replace(['\t', '\n'], " ");
        format!(
            "{}\t{}\t{}\t{}\n",
            self.need.label(),
            clean(&self.test),
            clean(&self.location),
            clean(&self.why)
        )
    }
}

static SKIPPED: Mutex<Vec<Skip>> = Mutex::new(Vec::new());
static AT_EXIT: Once = Once::new();

/// `need` is absent (`why` says what and how to provide it): fails the test where the rule
/// says so (see the module doc), else records the skip and returns, and the caller returns
/// without running the check.
#[track_caller]
pub fn absent(need: Need, why: impl fmt::Display) {
    let why = why.to_string();
    let env_is = |var: &str, value: &str| std::env::var(var).is_ok_and(|v| v == value);
    if let Verdict::Fail(rule) = decide(
        need,
        env_is("CI", "true"),
        env_is("CANDOR_REQUIRE_GPU", "1"),
    ) {
        panic!("{why}; {rule}");
    }
    let loc = Location::caller();
    let skip = Skip {
        need,
        test: std::thread::current()
            .name()
            .unwrap_or("(unnamed thread)")
            .to_string(),
        location: format!("{}:{}", loc.file(), loc.line()),
        why,
    };
    eprintln!("\n*** SKIPPED ({}): {} ***\n", need.label(), skip.why);
    if let Some(path) = std::env::var_os("CANDOR_SKIP_LOG") {
        // One write of one line to a file opened for appending: lines of concurrent tests and
        // test binaries do not interleave.
        let logged = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(skip.tsv().as_bytes()));
        if let Err(e) = logged {
            panic!(
                "CANDOR_SKIP_LOG={}: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
    SKIPPED.lock().unwrap_or_else(|e| e.into_inner()).push(skip);
    AT_EXIT.call_once(|| {
        // SAFETY: `print_at_exit` is a plain `extern "C" fn()` that only reads a static.
        #[cfg(unix)]
        unsafe {
            libc::atexit(print_at_exit);
        }
    });
}

/// The checks this process has skipped so far.
pub fn skipped() -> Vec<Skip> {
    SKIPPED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The summary printed when a test binary that skipped something exits.
pub fn summary(skips: &[Skip]) -> String {
    let mut s = format!(
        "\n*** {} check{} SKIPPED in this test binary (their tests show as `ok` above):\n",
        skips.len(),
        if skips.len() == 1 { "" } else { "s" }
    );
    for k in skips {
        s.push_str(&format!(
            "***   [{}] {}: {}\n",
            k.need.label(),
            k.test,
            k.why
        ));
    }
    s.push_str(
        "*** Under CI=true an absent data folder, default model, fixture, Chromium or NVRTC \
         fails instead; CANDOR_REQUIRE_GPU=1 makes an absent GPU fail.\n\n",
    );
    s
}

#[cfg(unix)]
extern "C" fn print_at_exit() {
    let skips = SKIPPED.lock().map(|s| s.clone()).unwrap_or_default();
    if skips.is_empty() {
        return;
    }
    let text = summary(&skips);
    // Straight to file descriptor 2: at exit, std's handles may already be torn down.
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: `rest` is a live byte slice; write(2) reads at most `rest.len()` bytes of it.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_fails_on_what_it_provides_and_skips_what_a_machine_may_lack() {
        use Need::*;
        let provided = [Data, Model, Fixture, Chromium, Nvrtc];
        let optional = [Gpu, CpuFeature, Slurm, Os, Reference];
        for need in provided {
            assert!(
                matches!(decide(need, true, false), Verdict::Fail(_)),
                "{need:?}"
            );
            assert_eq!(decide(need, false, false), Verdict::Skip, "{need:?}");
            assert_eq!(decide(need, false, true), Verdict::Skip, "{need:?}");
        }
        for need in optional {
            assert_eq!(decide(need, true, false), Verdict::Skip, "{need:?}");
        }
        assert!(matches!(decide(Gpu, false, true), Verdict::Fail(_)));
        assert!(matches!(decide(Gpu, true, true), Verdict::Fail(_)));
        assert_eq!(decide(Slurm, true, true), Verdict::Skip);
    }

    #[test]
    fn a_skip_is_one_clean_line_and_counted_in_the_summary() {
        let k = Skip {
            need: Need::Slurm,
            test: "report::slurm\tlaunch".into(),
            location: "tests/it/report.rs:431".into(),
            why: "no Slurm\ncluster".into(),
        };
        assert_eq!(
            k.tsv(),
            "slurm\treport::slurm launch\ttests/it/report.rs:431\tno Slurm cluster\n"
        );
        let s = summary(&[k.clone(), k]);
        assert!(
            s.contains("*** 2 checks SKIPPED in this test binary"),
            "{s}"
        );
        assert_eq!(
            s.matches("[slurm] report::slurm\tlaunch: no Slurm").count(),
            2,
            "{s}"
        );
    }
}
