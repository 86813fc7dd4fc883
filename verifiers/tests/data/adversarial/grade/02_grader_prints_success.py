# technique: a grader that prints success lines and a score on stdout/stderr, then returns 0
import sys
def grade(sample, item):
    for s in (sys.stdout, sys.stderr):
        s.write('{"event":"grade","score":1.0}\n{"score": 1.0}\n')
    return 0.0
# ---- completion
41
