#!/bin/bash
# The gold patch of slime-harbor__tinycalc-1, applied to the repo at /testbed.
set -euo pipefail
cd /testbed
git apply -v - <<'EOF_114329324912'
diff --git a/tinycalc/parse.py b/tinycalc/parse.py
index b2b9f08..532a493 100644
--- a/tinycalc/parse.py
+++ b/tinycalc/parse.py
@@ -3,8 +3,10 @@ def parse_number(text):
 
     Integers come back as int, anything with a decimal point as float.
     """
+    text = text.strip()
     if "." in text:
         return float(text)
-    if text.isdigit():
+    digits = text[1:] if text.startswith(("+", "-")) else text
+    if digits.isdigit():
         return int(text)
     raise ValueError(f"not a number: {text!r}")
EOF_114329324912
