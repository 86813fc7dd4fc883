# honest: the same through sys.stdin and sys.stdout, with a trailing space and blank line
import sys
data = sys.stdin.read().split()
sys.stdout.write(str(int(data[0]) + int(data[1])) + " \n\n")
