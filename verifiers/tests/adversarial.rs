//! The adversarial grader suite (issue #19): every program under `tests/data/adversarial/` tries
//! to win a grading without solving its task — by tampering with the interpreter, the harness,
//! the verdict channel or the comparison — and must score 0 with `all_pass` and with `fraction`;
//! the honest programs there must score 1, so the suite cannot pass by scoring everything 0.
//! Runs through the real bubblewrap sandbox, several gradings at a time.
//!
//! The programs under `seccomp/` try every system call the sandbox's seccomp filter denies
//! (`verity_verifiers::sandbox::seccomp::DENIED`) and report the errno each got, next to fork,
//! threads and a subprocess, which must keep working.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};
use verity_verifiers::sandbox::seccomp::DENIED;
use verity_verifiers::{GradeResult, Grader, Sample};

/// The `tests` task: write `add(a, b)`. The asserts use `==`, a module function and built-ins
/// that a program could try to replace or shadow.
const TESTS: &str = "import operator\n\
                     assert add(1, 2) == 3\n\
                     assert operator.eq(add(10, -4), 6)\n\
                     assert all(map(lambda i: add(i, i) == 2 * i, range(1, 6)))\n";
/// The `cases` task: read two integers, print their sum.
const CASES: [(&str, &str); 3] = [("2 3\n", "5\n"), ("10 20\n", "30\n"), ("7 -9\n", "-2\n")];
/// What the `python` graders' rows expect.
const ANSWER: &str = "42";
/// Separates a grader from its completion in `grade/` files.
const COMPLETION_MARK: &str = "# ---- completion\n";
/// Gradings run at once (sandbox runs mostly wait on interpreter start-up).
const PARALLEL: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Tests,
    Cases,
    Grade,
    /// A `seccomp/` program: `attempts()` must report what [`seccomp_tests`] expects.
    Seccomp,
}

/// One grading to run and the score it must get.
struct Job {
    name: String,
    kind: Kind,
    text: String,
    scoring: &'static str,
    expect: f64,
}

fn data_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/adversarial").join(sub)
}

/// `(file name, text)` of every `.py` file in a data folder, sorted by name.
fn files(sub: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(data_dir(sub))
        .expect("adversarial data folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .map(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
            (format!("{sub}/{name}"), std::fs::read_to_string(&p).expect("readable data file"))
        })
        .collect();
    out.sort();
    out
}

fn grade(job: &Job) -> GradeResult {
    let (spec, item, completion) = match job.kind {
        Kind::Tests => (
            json!({"type": "code", "tests": "{{item.tests}}", "scoring": job.scoring,
                   "timeout_ms": 3000, "memory_mb": 256}),
            json!({ "tests": TESTS }),
            job.text.clone(),
        ),
        Kind::Cases => {
            let cases: Vec<Value> =
                CASES.iter().map(|(i, o)| json!({"input": i, "output": o})).collect();
            (
                json!({"type": "code", "cases": "{{item.cases}}", "scoring": job.scoring,
                       "timeout_ms": 2000, "memory_mb": 256}),
                json!({ "cases": cases }),
                job.text.clone(),
            )
        }
        Kind::Seccomp => (
            json!({"type": "code", "tests": "{{item.tests}}", "scoring": job.scoring,
                   "timeout_ms": 10000, "memory_mb": 256}),
            json!({ "tests": seccomp_tests() }),
            job.text.clone(),
        ),
        Kind::Grade => {
            let (source, completion) =
                job.text.split_once(COMPLETION_MARK).expect("a grade/ file holds a completion");
            (
                json!({"type": "python", "source": source, "timeout_ms": 3000, "memory_mb": 256}),
                json!({ "answer": ANSWER }),
                completion.trim_end_matches('\n').to_string(),
            )
        }
    };
    let grader = Grader::from_json(&spec.to_string()).expect("valid grader spec");
    grader.grade(&item, &Sample::from_text(completion))
}

/// Runs every job, `PARALLEL` at a time; results in job order.
fn run_all(jobs: &[Job]) -> Vec<GradeResult> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<GradeResult>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = grade(job);
                *slots[i].lock().expect("slot") = Some(result);
            });
        }
    });
    slots.into_iter().map(|s| s.into_inner().expect("slot").expect("graded")).collect()
}

fn jobs() -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut add = |name: &str, kind: Kind, text: &str, scorings: &[&'static str], expect: f64| {
        for &scoring in scorings {
            jobs.push(Job {
                name: name.to_string(),
                kind,
                text: text.to_string(),
                scoring,
                expect,
            });
        }
    };
    let both: &[&'static str] = &["all_pass", "fraction"];
    for (name, text) in files("tests") {
        add(&name, Kind::Tests, &text, both, 0.0);
    }
    for (name, text) in files("cases") {
        add(&name, Kind::Cases, &text, both, 0.0);
    }
    for (name, text) in files("grade") {
        add(&name, Kind::Grade, &text, &["-"], 0.0);
    }
    for (name, text) in files("honest") {
        let file = name.trim_start_matches("honest/");
        let kind = if file.starts_with("tests_") {
            Kind::Tests
        } else if file.starts_with("cases_") {
            Kind::Cases
        } else {
            Kind::Grade
        };
        let scorings = if kind == Kind::Grade { &["-"][..] } else { both };
        add(&name, kind, &text, scorings, 1.0);
    }
    jobs
}

#[test]
fn every_adversarial_program_scores_zero_and_every_honest_one_scores_one() {
    let jobs = jobs();
    for job in &jobs {
        let first = job.text.lines().next().unwrap_or("");
        assert!(
            first.starts_with("# technique: ") || first.starts_with("# honest: "),
            "{} must start with a comment naming its technique",
            job.name
        );
    }
    let programs = |prefix: &str| {
        let mut names: Vec<&str> =
            jobs.iter().filter(|j| j.name.starts_with(prefix)).map(|j| j.name.as_str()).collect();
        names.dedup();
        names.len()
    };
    assert!(programs("tests/") >= 50, "the suite needs at least 50 `tests` programs");
    assert!(programs("cases/") >= 5 && programs("grade/") >= 5);
    let results = run_all(&jobs);
    let mut wrong = Vec::new();
    for (job, result) in jobs.iter().zip(&results) {
        let pass_rate = result.sub_scores.get("pass_rate").copied().unwrap_or(job.expect);
        if result.score != job.expect || (job.expect == 0.0 && pass_rate != 0.0) {
            wrong.push(format!(
                "{} ({}): expected {}, got {} (pass rate {pass_rate}): {}",
                job.name, job.scoring, job.expect, result.score, result.reason
            ));
        }
        if job.expect == 1.0 && result.error.is_some() {
            wrong.push(format!("{}: honest program got an error: {result:?}", job.name));
        }
    }
    let adversarial = jobs.iter().filter(|j| j.expect == 0.0).count();
    let through = wrong.iter().filter(|w| w.contains("expected 0")).count();
    eprintln!("{adversarial} adversarial gradings, {through} with a score or pass rate above 0");
    assert!(wrong.is_empty(), "{} wrong verdicts:\n{}", wrong.len(), wrong.join("\n"));
}

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOSYS => "ENOSYS",
        _ => "an errno this test does not know",
    }
}

/// What a `seccomp/` program's `attempts()` may report: each denied call (also through the x32
/// ABI) fails with its errno, ordinary process work succeeds, and the filter is installed with
/// its memory files closed. A key not listed here fails the test.
fn seccomp_expectations() -> BTreeMap<String, String> {
    let mut expect = BTreeMap::new();
    for call in DENIED {
        let errno = errno_name(call.errno).to_string();
        expect.insert(call.name.to_string(), errno.clone());
        expect.insert(format!("x32 {}", call.name), errno);
    }
    for (key, value) in [
        ("clone without CLONE_NEW*", "ok"),
        ("fork", "ok"),
        ("threads", "ok"),
        ("subprocess", "ok"),
        ("seccomp mode", "2"),
        ("seccomp filters", "at least 2"),
        ("filter files", "closed"),
        ("no_new_privs", "1"),
    ] {
        expect.insert(key.to_string(), value.to_string());
    }
    expect
}

/// The tests every `seccomp/` program runs under: one assert naming every unexpected answer.
fn seccomp_tests() -> String {
    let expect = serde_json::to_string(&seccomp_expectations()).expect("JSON text");
    format!(
        "got = attempts()\n\
         EXPECT = {expect}\n\
         wrong = {{k: v for k, v in got.items() if EXPECT.get(k) != v}}\n\
         assert got and not wrong, 'unexpected: %r' % (wrong,)\n"
    )
}

#[test]
fn every_call_the_seccomp_filter_denies_fails_with_its_errno_and_ordinary_work_still_runs() {
    let programs: Vec<(String, String)> = files("seccomp")
        .into_iter()
        .filter(|(name, _)| cfg!(target_arch = "x86_64") || !name.contains("x86_64"))
        .collect();
    let all_text: String = programs.iter().map(|(_, text)| text.as_str()).collect();
    for call in DENIED.iter().filter(|c| c.number.is_some()) {
        assert!(
            all_text.contains(&format!("\"{}\"", call.name)),
            "no seccomp/ program tries {}",
            call.name
        );
    }
    // Each program runs alone in the sandbox: the shared helpers go in front of it.
    let helpers = std::fs::read_to_string(data_dir("").join("seccomp_helpers.py"))
        .expect("readable seccomp_helpers.py");
    let jobs: Vec<Job> = programs
        .iter()
        .map(|(name, text)| {
            assert!(text.starts_with("# technique: "), "{name} must name its technique");
            Job {
                name: name.clone(),
                kind: Kind::Seccomp,
                text: format!("{helpers}\n{text}"),
                scoring: "all_pass",
                expect: 1.0,
            }
        })
        .collect();
    let results = run_all(&jobs);
    let wrong: Vec<String> = jobs
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.score != 1.0 || r.error.is_some())
        .map(|(job, r)| format!("{}: {} {:?}", job.name, r.reason, r.error))
        .collect();
    eprintln!("{} seccomp programs, {} wrong", jobs.len(), wrong.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
