#!/bin/bash
set -e
cat > /app/fizzbuzz.py <<'PY'
import sys

n, a, b = (int(arg) for arg in sys.argv[1:4])
for i in range(1, n + 1):
    word = ("Fizz" if i % a == 0 else "") + ("Buzz" if i % b == 0 else "")
    print(word or i)
PY
