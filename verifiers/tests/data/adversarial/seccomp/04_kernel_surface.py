# technique: reach kernel attack surface no grader needs (keyrings, bpf, perf events,
# userfaultfd, io_uring, lookup_dcookie); every call gets EPERM.
import ctypes
import errno
import os

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
MACHINE = os.uname().machine


def call(numbers, *args):
    """Makes the raw system call numbered for this machine in `numbers` (x86_64, aarch64):
    "ok" when it succeeded (a returned fd is closed), else the errno name."""
    ctypes.set_errno(0)
    ret = LIBC.syscall(ctypes.c_long(numbers[MACHINE]), *[ctypes.c_long(a) for a in args])
    if ret >= 0:
        return "ok"
    code = ctypes.get_errno()
    return errno.errorcode.get(code, str(code))


def addr(buffer):
    return ctypes.cast(buffer, ctypes.c_void_p).value or 0


def attempts():
    user = ctypes.c_char_p(b"user")
    params = ctypes.create_string_buffer(120)
    return {
        # without the filter: EOPNOTSUPP (unknown operation)
        "keyctl": call({"x86_64": 250, "aarch64": 219}, 9999, 0, 0, 0, 0),
        # without the filter: EFAULT (bad description pointer)
        "add_key": call({"x86_64": 248, "aarch64": 217}, addr(user), 1, 0, 0, -4),
        "request_key": call({"x86_64": 249, "aarch64": 218}, addr(user), 1, 0, -4),
        # without the filter: EINVAL (unknown command) on current kernels
        "bpf": call({"x86_64": 321, "aarch64": 280}, 9999, 0, 0),
        # without the filter: EFAULT (no attributes)
        "perf_event_open": call({"x86_64": 298, "aarch64": 241}, 0, 0, -1, -1, 0),
        # UFFD_USER_MODE_ONLY | O_CLOEXEC: allowed without privilege, so it would succeed
        "userfaultfd": call({"x86_64": 323, "aarch64": 282}, 1 | os.O_CLOEXEC),
        # a real ring with zeroed parameters: succeeds without the filter where io_uring is on
        "io_uring_setup": call({"x86_64": 425, "aarch64": 425}, 8, addr(params)),
        "io_uring_enter": call({"x86_64": 426, "aarch64": 426}, -1, 0, 0, 0, 0, 0),
        "io_uring_register": call({"x86_64": 427, "aarch64": 427}, -1, 0, 0, 0),
        # without the filter: ENOSYS since Linux 6.8
        "lookup_dcookie": call({"x86_64": 212, "aarch64": 18}, 0, 0, 0),
    }
