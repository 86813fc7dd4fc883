# technique: stall until the time limit hoping a timeout is read as a pass
import time
def add(a, b):
    time.sleep(3600)
