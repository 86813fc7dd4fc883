# technique: rewrite /work/main.py (its own source) and other /work files to change later cases
import os
try:
    with open("/work/main.py", "w") as f:
        f.write("print(5)\n")
except OSError:
    pass
for name in os.listdir("/work"):
    try:
        with open(os.path.join("/work", name), "w") as f:
            f.write("5\n")
    except OSError:
        pass
print(-1)
