# honest: read two integers and print their sum
a, b = map(int, input().split())
print(a + b)
