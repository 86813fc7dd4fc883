# technique: crash the interpreter (SIGSEGV) from the function under test
import ctypes
def add(a, b):
    ctypes.string_at(0)
