# technique: look for a way around the filter: is the process unfiltered, or did the filter's
# memory files (the seccomp programs bwrap read) leak into the sandbox to be rewritten?
import os


def attempts():
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    leaked = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if "seccomp" in target:
            leaked.append(target)
    filters = int(status.get("Seccomp_filters", "0"))
    return {
        # 2: SECCOMP_MODE_FILTER
        "seccomp mode": status.get("Seccomp", "missing"),
        "seccomp filters": "at least 2" if filters >= 2 else str(filters),
        "filter files": "closed" if not leaked else ",".join(leaked),
        "no_new_privs": status.get("NoNewPrivs", "missing"),
    }
