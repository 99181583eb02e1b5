#!/bin/bash
# The gold patch of slime-harbor__textkit-2, applied to the repo at /testbed.
set -euo pipefail
cd /testbed
git apply -v - <<'EOF_114329324912'
diff --git a/textkit/slug.py b/textkit/slug.py
index fe89357..33e0e27 100644
--- a/textkit/slug.py
+++ b/textkit/slug.py
@@ -3,4 +3,4 @@ import re
 
 def slugify(text):
     """Lower-case URL slug: the words of `text` joined by single dashes ("Hello, World!" -> "hello-world")."""
-    return re.sub(r"[^a-z0-9]", "-", text.lower())
+    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
EOF_114329324912
