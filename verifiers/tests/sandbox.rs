//! The sandbox escape suite and the verdict-forging cases. Each run must be contained within its
//! limits and leave the host untouched; assertions are about containment, never speed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use verity_verifiers::{ErrorKind, GradeResult, Grader, Sample, SandboxConfig};

mod containment;
use containment::{processes_left_after_waiting, CONTAINED_WITHIN};

fn code_grader(timeout_ms: u64, memory_mb: u64) -> Grader {
    let spec = json!({"type": "code", "tests": "{{item.tests}}", "scoring": "all_pass",
                      "timeout_ms": timeout_ms, "memory_mb": memory_mb});
    Grader::from_json(&spec.to_string()).expect("valid grader")
}

/// Runs `program` against `tests`; returns the result and the wall time.
fn run(program: &str, tests: &str, timeout_ms: u64) -> (GradeResult, Duration) {
    let started = Instant::now();
    let result =
        code_grader(timeout_ms, 256).grade(&json!({ "tests": tests }), &Sample::from_text(program));
    let elapsed = started.elapsed();
    assert!(elapsed < CONTAINED_WITHIN, "not contained: {elapsed:?} {result:?}");
    (result, elapsed)
}

fn assert_wrong(result: &GradeResult) {
    assert_eq!(result.score, 0.0, "{result:?}");
    assert!(result.error.is_none(), "a wrong program is not an infrastructure error: {result:?}");
}

fn assert_passes(result: &GradeResult) {
    assert_eq!(result.score, 1.0, "{result:?}");
}

// ---------------------------------------------------------------- basic verdicts

#[test]
fn correct_program_passes_and_wrong_fails() {
    let tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0";
    assert_passes(&run("```python\ndef add(a, b):\n    return a + b\n```", tests, 10_000).0);
    assert_wrong(&run("def add(a, b):\n    return a - b", tests, 10_000).0);
}

#[test]
fn fraction_scoring_counts_each_top_level_test() {
    let spec = json!({"type": "code", "tests": "{{item.tests}}", "scoring": "fraction"});
    let grader = Grader::from_json(&spec.to_string()).unwrap();
    let tests = "assert f(1) == 1\nassert f(2) == 2\nassert f(3) == 4\nassert f(4) == 5";
    let r = grader.grade(&json!({"tests": tests}), &Sample::from_text("def f(x):\n    return x"));
    assert!((r.score - 0.5).abs() < 1e-9, "{r:?}");
}

#[test]
fn stdin_stdout_cases() {
    let spec = json!({"type": "code", "cases": "{{item.cases}}", "scoring": "fraction", "timeout_ms": 5000});
    let grader = Grader::from_json(&spec.to_string()).unwrap();
    let item = json!({"cases": [
        {"input": "2 3\n", "output": "5\n"}, {"input": "10 20\n", "output": "30"}, {"input": "1 1\n", "output": "3\n"}]});
    let r =
        grader.grade(&item, &Sample::from_text("a, b = map(int, input().split())\nprint(a + b)"));
    assert!((r.score - 2.0 / 3.0).abs() < 1e-9, "{r:?}");
}

#[test]
fn missing_sandbox_is_an_infrastructure_error() {
    let config = SandboxConfig { bwrap: "/nonexistent/bwrap".into(), ..SandboxConfig::default() };
    let spec: verity_verifiers::GraderSpec =
        serde_json::from_value(json!({"type": "code", "tests": "assert True"})).unwrap();
    let grader = Grader::with_sandbox(spec, Arc::new(config)).unwrap();
    let r = grader.grade(&json!({}), &Sample::from_text("x = 1"));
    assert_eq!(r.error.as_ref().map(|e| e.kind), Some(ErrorKind::Sandbox), "{r:?}");
}

// ---------------------------------------------------------------- escape suite

#[test]
fn network_is_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let program = format!(
        "import socket\n\
         def reach(host, port):\n    try:\n        socket.create_connection((host, port), timeout=2).close()\n        return True\n    except OSError:\n        return False\n\
         def resolve():\n    try:\n        socket.getaddrinfo('crates.io', 443)\n        return True\n    except OSError:\n        return False\n\
         PORT = {port}\n"
    );
    let tests = "assert reach('127.0.0.1', PORT) == False\nassert reach('1.1.1.1', 53) == False\nassert resolve() == False";
    assert_passes(&run(&program, tests, 20_000).0);
    assert!(listener.accept().is_err(), "the host listener was reached from the sandbox");
}

#[test]
fn writes_outside_the_work_dir_fail_and_never_reach_the_host() {
    let host_dir = std::env::temp_dir().join(format!("verity-escape-{}", std::process::id()));
    std::fs::create_dir_all(&host_dir).unwrap();
    let target = host_dir.join("pwned.txt");
    let program = format!(
        "import os\n\
         def try_write(path):\n    try:\n        with open(path, 'w') as f:\n            f.write('pwned')\n        return True\n    except OSError:\n        return False\n\
         HOST = {:?}\n",
        target.to_string_lossy()
    );
    let tests = "assert try_write('/usr/pwned') == False\nassert try_write('/pwned') == False\n\
                 assert try_write('/etc/pwned') == False\nassert try_write('/work/ok.txt') == True\n\
                 try_write(HOST)";
    assert_passes(&run(&program, tests, 20_000).0);
    assert!(!target.exists(), "a sandboxed write reached the host");
    std::fs::remove_dir_all(&host_dir).ok();
}

#[test]
fn host_secrets_are_hidden() {
    let secret_dir = std::env::temp_dir().join(format!("verity-secret-{}", std::process::id()));
    std::fs::create_dir_all(&secret_dir).unwrap();
    let secret = secret_dir.join("server.env");
    std::fs::write(&secret, "VERITY_JWT_SECRET=do-not-leak").unwrap();
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let program = format!(
        "import os\n\
         def read(path):\n    try:\n        with open(path) as f:\n            return f.read()\n    except OSError:\n        return None\n\
         SECRET = {:?}\nMANIFEST = {manifest:?}\n",
        secret.to_string_lossy()
    );
    let tests = "assert read(SECRET) is None\nassert read(MANIFEST) is None\nassert read('/etc/shadow') is None\n\
                 assert read('/etc/passwd') is None\nassert read('/root/.bash_history') is None\n\
                 assert 'VERITY' not in ''.join(os.environ)\nassert read('/usr/lib/os-release') is not None or True";
    assert_passes(&run(&program, tests, 20_000).0);
    std::fs::remove_dir_all(&secret_dir).ok();
}

#[test]
fn fork_bomb_is_contained() {
    let program = "import os, time\n\
                   def bomb():\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            time.sleep(0.01)\n";
    let (result, _) = run(program, "bomb()", 3_000);
    assert_wrong(&result);
    // the host can still start processes
    assert!(std::process::Command::new("true").status().unwrap().success());
}

#[test]
fn memory_bomb_is_contained() {
    let program =
        "def bomb():\n    hog = []\n    while True:\n        hog.append(bytearray(64 << 20))\n";
    let (result, _) = run(program, "bomb()", 10_000);
    assert_wrong(&result);
    assert!(result.reason.contains("MemoryError"), "{result:?}");
    let (result, _) =
        run("x = bytearray(8 << 30)\ndef f():\n    return 1", "assert f() == 1", 10_000);
    assert_wrong(&result);
}

#[test]
fn busy_loop_is_killed_at_its_limit() {
    let (result, elapsed) = run("def spin():\n    while True:\n        pass", "spin()", 1_000);
    assert_wrong(&result);
    assert!(result.reason.contains("time limit"), "{result:?}");
    assert!(elapsed >= Duration::from_millis(1_000));
}

#[test]
fn sleeping_forever_is_killed_at_its_limit() {
    let (result, _) = run("import time\ndef nap():\n    time.sleep(10**6)", "nap()", 1_000);
    assert_wrong(&result);
    assert!(result.reason.contains("time limit"), "{result:?}");
}

#[test]
fn output_flood_is_capped() {
    let program = "import sys\ndef flood():\n    while True:\n        sys.stdout.write('x' * 65536)\n        sys.stderr.write('y' * 65536)";
    let (result, _) = run(program, "flood()", 2_000);
    assert_wrong(&result);
    // a flooding stdin/stdout case is capped by the file-size limit
    let spec = json!({"type": "code", "cases": "{{item.cases}}", "timeout_ms": 5000});
    let grader = Grader::from_json(&spec.to_string()).unwrap();
    let r = grader.grade(
        &json!({"cases": [{"input": "", "output": "1"}]}),
        &Sample::from_text("while True:\n    print('x' * 100000)"),
    );
    assert_wrong(&r);
}

#[test]
fn background_processes_do_not_outlive_the_grading() {
    let marker = format!("verity-bg-marker-{}", std::process::id());
    let program = format!(
        "import os, subprocess, sys\n\
         subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'], start_new_session=True)\n\
         if os.fork() == 0:\n    os.setsid()\n    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'])\n\
         def f():\n    return 1\n"
    );
    assert_passes(&run(&program, "assert f() == 1", 10_000).0);
    assert_eq!(
        processes_left_after_waiting(&marker),
        0,
        "a background process outlived the grading"
    );
}

// ---------------------------------------------------------------- verdict forging

const TESTS: &str = "assert f(1) == 2\nassert f(5) == 10";

#[test]
fn sys_exit_zero_does_not_pass() {
    assert_wrong(&run("import sys\nsys.exit(0)", TESTS, 10_000).0);
    assert_wrong(&run("import sys\ndef f(x):\n    sys.exit(0)", TESTS, 10_000).0);
}

#[test]
fn os_exit_zero_does_not_pass() {
    assert_wrong(&run("import os\nos._exit(0)", TESTS, 10_000).0);
    assert_wrong(&run("import os\ndef f(x):\n    os._exit(0)", TESTS, 10_000).0);
}

#[test]
fn printing_success_does_not_pass() {
    let program = "print('all tests passed')\nprint('{\"event\": \"done\"}')\ndef f(x):\n    print('OK: all tests passed')\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
}

#[test]
fn system_exit_in_a_finaliser_does_not_pass() {
    let program = "import os\nclass Bye:\n    def __del__(self):\n        raise SystemExit(0)\n\
                   class Hard:\n    def __del__(self):\n        os._exit(0)\n\
                   def f(x):\n    Bye()\n    Hard()\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
    let program = "import atexit, os\natexit.register(lambda: os._exit(0))\nkeep = []\nclass Bye:\n    def __del__(self):\n        raise SystemExit(0)\nkeep.append(Bye())\ndef f(x):\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
}

#[test]
fn always_equal_objects_do_not_pass() {
    let program = "class Eq:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n        return False\n\
                   def f(x):\n    return Eq()";
    assert_wrong(&run(program, TESTS, 10_000).0);
    let program = "class Two(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\ndef f(x):\n    return Two(0)";
    assert_wrong(&run(program, TESTS, 10_000).0);
    let program =
        "class Yes:\n    def __bool__(self):\n        return True\ndef f(x):\n    return Yes()";
    assert_wrong(&run(program, "assert f(1)", 10_000).0);
    let program = "class Tiny(float):\n    def __sub__(self, o):\n        return 0.0\n    def __lt__(self, o):\n        return True\ndef f(x):\n    return Tiny(0)";
    assert_wrong(&run(program, "assert abs(f(1) - 2) < 1e-9", 10_000).0);
}

#[test]
fn editing_the_tests_or_forging_the_channel_does_not_pass() {
    // patching builtins used by the tests
    let program = "import builtins\nbuiltins.abs = lambda x: 0\ndef f(x):\n    return 0";
    assert_wrong(&run(program, "assert abs(f(1) - 2) < 1e-9", 10_000).0);
    // reaching the test namespace through frames
    let program = "import sys\ndef f(x):\n    sys._getframe(1).f_globals['__verity_cmp__'] = lambda *a: True\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
    let program = "def f(x):\n    try:\n        raise ValueError\n    except ValueError as e:\n        e.__traceback__.tb_frame.f_back.f_globals['__verity_cmp__'] = lambda *a: True\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
    // looking for test files and writing fake verdict lines
    let program = "import os, glob\nfor p in glob.glob('/**/*test*', recursive=True):\n    try:\n        open(p, 'w').write('')\n    except OSError:\n        pass\n\
                   for fd in range(3, 20):\n    try:\n        os.write(fd, b'{\"event\":\"test\",\"index\":0,\"passed\":true}\\n{\"event\":\"done\"}\\n')\n    except OSError:\n        pass\n\
                   os._exit(0)";
    assert_wrong(&run(program, TESTS, 10_000).0);
    // a tracer that skips the assert lines
    let program = "import sys\ndef skip(frame, event, arg):\n    return skip\nsys.settrace(skip)\ndef f(x):\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
}

// ---------------------------------------------------------------- python grader

fn python_grader(source: &str) -> Grader {
    Grader::from_json(&json!({"type": "python", "source": source, "timeout_ms": 2000}).to_string())
        .unwrap()
}

#[test]
fn python_grader_scores_and_reports_its_own_failures() {
    let item = json!({"reference": "hello"});
    let sample = Sample::from_text("hello");
    let ok = python_grader("def grade(sample, item):\n    return 1.0 if sample['output_text'] == item['reference'] else 0.0");
    assert_eq!(ok.grade(&item, &sample).score, 1.0);
    assert_eq!(ok.grade(&item, &Sample::from_text("bye")).score, 0.0);
    let clamped = python_grader("def grade(sample, item):\n    return 7");
    assert_eq!(clamped.grade(&item, &sample).score, 1.0);
    let raises = python_grader("def grade(sample, item):\n    raise KeyError('x')");
    assert_eq!(raises.grade(&item, &sample).error.map(|e| e.kind), Some(ErrorKind::GraderCode));
    let text = python_grader("def grade(sample, item):\n    return 'high'");
    assert_eq!(text.grade(&item, &sample).error.map(|e| e.kind), Some(ErrorKind::GraderCode));
    let slow = python_grader("def grade(sample, item):\n    while True:\n        pass");
    assert_eq!(slow.grade(&item, &sample).error.map(|e| e.kind), Some(ErrorKind::Timeout));
}

#[test]
fn walking_frames_from_program_code_finds_no_test_namespace() {
    // the program runs in its own process: its frames never lead to the tests
    let program = "import sys\ndef f(x):\n    frame = sys._getframe(0)\n    while frame is not None:\n        g = frame.f_globals\n        if '__verity_cmp__' in g:\n            g['__verity_cmp__'] = lambda *a: True\n            g['__verity_truth__'] = lambda v: True\n        frame = frame.f_back\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
    let program = "import sys\nclass S:\n    def __init__(self):\n        frame = sys._getframe(0)\n        while frame is not None:\n            frame.f_globals['__verity_cmp__'] = lambda *a: True\n            frame = frame.f_back\n    def f(self, x):\n        return 0";
    assert_wrong(&run(program, "assert S().f(1) == 2", 10_000).0);
    let program = "import sys\ndef f(x):\n    frame = sys._getframe(0)\n    while frame is not None:\n        frame.f_globals['__verity_cmp__'] = lambda *a: True\n        frame = frame.f_back\n    yield 0";
    assert_wrong(&run(program, "assert list(f(1)) == [2]", 10_000).0);
    // a correct generator and a correct class still pass
    assert_passes(&run("def f(x):\n    yield 2 * x", "assert list(f(1)) == [2]", 10_000).0);
    assert_passes(
        &run(
            "class S:\n    def f(self, x):\n        return 2 * x",
            "assert S().f(1) == 2\nassert sorted([3, 1], key=lambda v: S().f(v)) == [1, 3]",
            10_000,
        )
        .0,
    );
}

#[test]
fn module_code_cannot_reach_the_harness() {
    // module-level code runs in the child process: no frame leads to the harness's emit or nonce
    let program = "import sys\nframe = sys._getframe(0)\nwhile frame is not None:\n    for name, value in list(frame.f_locals.items()):\n        if callable(value) and name == 'emit':\n            value('test', index=0, passed=True, message='')\n            value('test', index=1, passed=True, message='')\n            value('done')\n            import os\n            os._exit(0)\n    frame = frame.f_back\ndef f(x):\n    return 0";
    assert_wrong(&run(program, TESTS, 10_000).0);
    // exceptions of program classes are reported without running program code
    let program = "class Boom(Exception):\n    def __str__(self):\n        import os\n        os._exit(0)\ndef f(x):\n    raise Boom()";
    let (r, _) = run(program, TESTS, 10_000);
    assert_wrong(&r);
    assert!(r.reason.contains("defined by the program"), "{r:?}");
}

#[test]
fn test_helpers_cannot_be_patched_through_frames_or_finalisers() {
    // a program object's finaliser runs in the program's process; it patches every namespace it
    // can reach there, none of which is the tests'
    let program = "import sys, gc\nclass S:\n    def f(self, x):\n        return 0\n    def __del__(self):\n        frame = sys._getframe(0)\n        while frame is not None:\n            for k in list(frame.f_globals):\n                if 'verity' in k:\n                    frame.f_globals[k] = lambda *a, **kw: True\n            frame = frame.f_back";
    let tests = "def check():\n    assert S().f(1) == 2\n    assert S().f(2) == 4\ncheck()";
    assert_wrong(&run(program, tests, 10_000).0);
    // the program's interpreter is not the tests': a correct program may re-enable the collector
    let program = "import gc\ngc.enable()\ndef f(x):\n    gc.enable()\n    return 2 * x";
    assert_passes(&run(program, TESTS, 10_000).0);
    // attribute and item access on program objects still work for honest class-based tasks
    let program = "class Box:\n    def __init__(self):\n        self.items = [1, 2, 3]\n    def __getitem__(self, i):\n        return self.items[i]\n    @property\n    def size(self):\n        return len(self.items)";
    assert_passes(
        &run(
            program,
            "b = Box()\nassert b.size == 3\nassert b[1] == 2\nassert b.items == [1, 2, 3]",
            10_000,
        )
        .0,
    );
}

#[test]
fn common_test_idioms_pass_for_a_correct_program() {
    let program = "import math\nfrom typing import List\n\ndef double(x):\n    return 2 * x\n\ndef rev(s: str) -> str:\n    return s[::-1]\n\ndef uniq(xs: List[int]) -> List[int]:\n    return sorted(set(xs))\n\ndef root(x):\n    return math.sqrt(x)\n\ndef add(a, b=0):\n    return a + b\n\ndef pairs(n):\n    return [(i, i * i) for i in range(n)]\n\ndef count():\n    return {'a': 1, 'b': 2}\n";
    let tests = "import math\nMETADATA = {'author': 'x', 'dataset': 'test'}\n\n\
                 def check(candidate):\n    for x in range(20):\n        assert candidate(x) == x * 2, f'failed on {x}'\n    assert candidate(0.5) == 1.0\n\n\
                 check(double)\n\
                 assert rev('abc') == 'cba', 'reverse'\n\
                 assert set(uniq([3, 1, 1, 2])) == {1, 2, 3}\n\
                 assert abs(root(2.0) - 1.41421356) < 1e-6\n\
                 assert math.isclose(root(9), 3.0)\n\
                 assert add(*[1, 2]) == 3 and add(a=1) == 1\n\
                 assert pairs(3)[2] == (2, 4)\n\
                 assert len(pairs(5)) == 5\n\
                 assert count()['b'] == 2\n\
                 assert all(double(i) % 2 == 0 for i in range(5))\n\
                 assert [double(i) for i in range(3)] == [0, 2, 4]\n\
                 assert rev('') == '' and not rev('')\n\
                 assert True\n";
    assert_passes(&run(program, tests, 20_000).0);
}

#[test]
fn site_packages_stay_importable() {
    let site: Vec<String> = SandboxConfig::default()
        .python_site_paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let program = format!("import sys\nSITE = {site:?}\ndef visible():\n    return all(p in sys.path for p in SITE)\n");
    assert_passes(&run(&program, "assert visible() == True", 10_000).0);
    let spec = json!({"type": "code", "cases": "{{item.cases}}", "timeout_ms": 5000});
    let grader = Grader::from_json(&spec.to_string()).unwrap();
    let case_program =
        format!("import sys\nprint(all(p in sys.path for p in {site:?}))\nprint(__name__)");
    let r = grader.grade(
        &json!({"cases": [{"input": "", "output": "True\n__main__\n"}]}),
        &Sample::from_text(case_program),
    );
    assert_passes(&r);
}

/// The code exploit probes (`verity_verifiers::probes`) against a real sandboxed `code` grader:
/// a program exiting 0 before the tests and functions returning an always-equal object both
/// score 0 (the harness counts verdicts, not the exit status, and tests compare plain data),
/// and neither is an infrastructure error.
#[test]
fn code_exploit_probes_score_zero_in_the_sandbox() {
    let item = json!({"prompt": "Write add(a, b).", "tests": "assert add(1, 2) == 3\nassert add(2, 2) == 4\n"});
    let results = verity_verifiers::probes::run_probes(&code_grader(5000, 256), &item, None);
    for name in ["exit_before_asserts", "eq_override"] {
        let probe = results.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(probe.score, 0.0, "{probe:?}");
        assert!(probe.error.is_none(), "{probe:?}");
    }
    let eq = results.iter().find(|r| r.name == "eq_override").expect("eq_override");
    assert!(eq.reason.contains("plain data"), "{}", eq.reason);
}
