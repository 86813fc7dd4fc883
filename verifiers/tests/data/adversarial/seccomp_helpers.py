# The helpers of the seccomp/ programs: verifiers/tests/adversarial.rs puts them in front of
# each program (which runs alone in the sandbox, so it cannot import them).
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
