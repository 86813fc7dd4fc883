# technique: change the file-system view (mount, umount2, pivot_root, chroot, the new mount
# API, open_by_handle_at) to write outside /work or read the host; every call gets EPERM.


def attempts():
    root = ctypes.c_char_p(b"/")
    work = ctypes.c_char_p(b"/work")
    tmpfs = ctypes.c_char_p(b"tmpfs")
    handle = ctypes.create_string_buffer(128)
    mount_id = ctypes.c_int(0)
    return {
        # without the filter: EFAULT (the type pointer is read first)
        "mount": call({"x86_64": 165, "aarch64": 40}, addr(tmpfs), addr(work), 1, 0, 0),
        # without the filter: EINVAL (unknown flags)
        "umount2": call({"x86_64": 166, "aarch64": 39}, addr(work), 0xFFFF),
        "pivot_root": call({"x86_64": 155, "aarch64": 41}, addr(work), addr(work)),
        # without the filter: EFAULT
        "chroot": call({"x86_64": 161, "aarch64": 51}, 1),
        "fsopen": call({"x86_64": 430, "aarch64": 430}, addr(tmpfs), 0),
        "fsconfig": call({"x86_64": 431, "aarch64": 431}, -1, 0, 0, 0, 0),
        "fsmount": call({"x86_64": 432, "aarch64": 432}, -1, 0xFF, 0),
        "fspick": call({"x86_64": 433, "aarch64": 433}, -100, addr(root), 0),
        "move_mount": call({"x86_64": 429, "aarch64": 429}, -100, addr(work), -100, addr(root), 0),
        # without the filter: EINVAL (unknown flags)
        "open_tree": call({"x86_64": 428, "aarch64": 428}, -100, addr(root), 0x7FFFFFFF),
        "mount_setattr": call({"x86_64": 442, "aarch64": 442}, -100, addr(root), 0x7FFFFFFF, 0, 0),
        "name_to_handle_at": call({"x86_64": 303, "aarch64": 264}, -100, addr(root),
                                  addr(handle), ctypes.addressof(mount_id), 0),
        "open_by_handle_at": call({"x86_64": 304, "aarch64": 265}, -100, addr(handle), 0),
    }
