#!/bin/bash
set -uxo pipefail
cd /testbed
if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; conda activate testbed; fi
rm -rf -- tests/test_merge_order.py
git apply -v - <<'EOF_114329324912' || { echo '>>>>> Patch Apply Failed'; exit 1; }
diff --git a/tests/test_merge_order.py b/tests/test_merge_order.py
new file mode 100644
index 0000000..7445355
--- /dev/null
+++ b/tests/test_merge_order.py
@@ -0,0 +1,9 @@
+from intervals.merge import merge
+
+
+def test_unsorted_input():
+    assert merge([[8, 9], [1, 3], [2, 4]]) == [[1, 4], [8, 9]]
+
+
+def test_touching_intervals():
+    assert merge([[1, 2], [2, 3]]) == [[1, 3]]
EOF_114329324912
: '>>>>> Start Test Output'
pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_merge_order.py
SWEBENCH_TEST_EXIT_CODE=$?
: '>>>>> End Test Output'
echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"
