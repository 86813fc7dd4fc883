# technique: return enormous or deeply nested values to crash the harness's encoder/decoder
def add(a, b):
    x = []
    for _ in range(100000):
        x = [x]
    return x if a < 5 else "9" * 50_000_000
