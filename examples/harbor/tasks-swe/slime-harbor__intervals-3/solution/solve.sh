#!/bin/bash
# The gold patch of slime-harbor__intervals-3, applied to the repo at /testbed.
set -euo pipefail
cd /testbed
git apply -v - <<'EOF_114329324912'
diff --git a/intervals/merge.py b/intervals/merge.py
index cd280a7..a791f9a 100644
--- a/intervals/merge.py
+++ b/intervals/merge.py
@@ -1,8 +1,8 @@
 def merge(intervals):
     """Merge overlapping or touching [start, end] intervals; returns them sorted by start."""
     merged = []
-    for start, end in intervals:
-        if merged and start < merged[-1][1]:
+    for start, end in sorted(intervals):
+        if merged and start <= merged[-1][1]:
             merged[-1][1] = max(merged[-1][1], end)
         else:
             merged.append([start, end])
EOF_114329324912
