# honest: a correct add
def add(a, b):
    return a + b
