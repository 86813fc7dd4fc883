# honest: a correct add whose module does unusual but harmless things (threads, gc, atexit, prints)
import atexit, gc, sys, threading
gc.enable()
sys.setrecursionlimit(10_000)
atexit.register(lambda: None)
print("loading")
done = threading.Event()
threading.Thread(target=done.set).start()
done.wait()
def add(a, b):
    print("adding", a, b, file=sys.stderr)
    return sum([a, b])
