# honest: a correct add built from a class, a generator, globals and module imports
import operator
from functools import reduce

class Adder:
    def __init__(self, start=0):
        self.total = start

    def plus(self, x):
        return Adder(self.total + x)

def terms(*xs):
    yield from xs

def add(a, b):
    return reduce(operator.add, terms(a, b), Adder().plus(0).total)
