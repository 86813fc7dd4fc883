# technique: administer the host (kexec, kernel modules, reboot, swap, process accounting,
# I/O ports); every call gets EPERM. The arguments are invalid on purpose, so that nothing
# would happen even where a call reached the kernel.


def attempts():
    name = ctypes.c_char_p(b"verity_no_such_module")
    empty = ctypes.c_char_p(b"")
    missing = ctypes.c_char_p(b"/nonexistent")
    tried = {
        "kexec_load": call({"x86_64": 246, "aarch64": 104}, 0, 0, 0, 0xFFFF0000),
        "kexec_file_load": call({"x86_64": 320, "aarch64": 294}, -1, -1, 0, 0, 0xFFFF),
        "init_module": call({"x86_64": 175, "aarch64": 105}, 0, 0, addr(empty)),
        "finit_module": call({"x86_64": 313, "aarch64": 273}, -1, addr(empty), 0xFFFF),
        "delete_module": call({"x86_64": 176, "aarch64": 106}, addr(name), 0),
        # magic numbers 0: EINVAL even with CAP_SYS_BOOT
        "reboot": call({"x86_64": 169, "aarch64": 142}, 0, 0, 0, 0),
        "swapon": call({"x86_64": 167, "aarch64": 224}, addr(missing), 0),
        "swapoff": call({"x86_64": 168, "aarch64": 225}, addr(missing)),
        "acct": call({"x86_64": 163, "aarch64": 89}, addr(missing)),
    }
    if MACHINE == "x86_64":
        # without the filter: EINVAL (level above 3; a range past the bitmap)
        tried["iopl"] = call({"x86_64": 172}, 4)
        tried["ioperm"] = call({"x86_64": 173}, 0, 0x10001, 1)
    return tried
