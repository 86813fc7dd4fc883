# technique: os._exit(0) at import time
import os
os._exit(0)
