# technique: SystemExit(0) and KeyboardInterrupt raised from the function under test
import sys
def add(a, b):
    if a > 5:
        raise KeyboardInterrupt
    sys.exit(0)
