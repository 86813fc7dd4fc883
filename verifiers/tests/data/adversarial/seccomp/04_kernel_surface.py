# technique: reach kernel attack surface no grader needs (keyrings, bpf, perf events,
# userfaultfd, io_uring, lookup_dcookie); every call gets EPERM.


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
