# technique: make new namespaces (unshare, setns, clone with CLONE_NEW*, clone3) to gain
# capabilities inside them; the filter refuses them (clone3 with ENOSYS) while fork, threads
# and subprocesses, which use clone without those flags, keep working.

import subprocess
import sys
import threading

CLONE = {"x86_64": 56, "aarch64": 220}
SIGCHLD = 17
CLONE_NEW = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000,
             "NEWIPC": 0x08000000, "NEWUSER": 0x10000000, "NEWPID": 0x20000000,
             "NEWNET": 0x40000000}


def raw_clone(flags):
    """clone(flags | SIGCHLD) like fork: the child exits at once; "ok" when it ran."""
    ctypes.set_errno(0)
    pid = LIBC.syscall(ctypes.c_long(CLONE[MACHINE]), ctypes.c_long(flags | SIGCHLD),
                       ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
    if pid == 0:
        os._exit(0)
    if pid < 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    _, status = os.waitpid(pid, 0)
    return "ok" if os.waitstatus_to_exitcode(status) == 0 else "child failed"


def forked():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    return "ok" if os.waitstatus_to_exitcode(status) == 7 else "wrong exit code"


def threads():
    seen = []
    workers = [threading.Thread(target=seen.append, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return "ok" if sorted(seen) == [0, 1, 2, 3] else "threads lost work"


def spawned():
    out = subprocess.run([sys.executable, "-I", "-c", "print(6 * 7)"], capture_output=True)
    return "ok" if out.stdout == b"42\n" else "subprocess failed: %r" % (out.stderr[-200:],)


def attempts():
    clone = sorted({raw_clone(flag) for flag in CLONE_NEW.values()})
    return {
        # without the filter: ENOSPC (bwrap --disable-userns) or success (as root)
        "unshare": call({"x86_64": 272, "aarch64": 97}, CLONE_NEW["NEWUSER"]),
        # without the filter: EBADF
        "setns": call({"x86_64": 308, "aarch64": 268}, -1, 0),
        # every CLONE_NEW* flag, one at a time
        "clone": ",".join(clone),
        # without the filter: EINVAL (no clone_args)
        "clone3": call({"x86_64": 435, "aarch64": 435}, 0, 0),
        "clone without CLONE_NEW*": raw_clone(0),
        "fork": forked(),
        "threads": threads(),
        "subprocess": spawned(),
    }
