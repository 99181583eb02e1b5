#!/bin/bash
set -uxo pipefail
cd /testbed
if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; conda activate testbed; fi
git checkout 0b73efefcd81ca0d2548593dccb16ed1fbb709ce -- tests/test_merge.py || { echo '>>>>> Reset Failed'; exit 1; }
rm -rf -- tests/test_merge_order.py
git apply -v - <<'EOF_114329324912' || { echo '>>>>> Patch Apply Failed'; exit 1; }
diff --git a/tests/test_merge.py b/tests/test_merge.py
index 74b6604..0418210 100644
--- a/tests/test_merge.py
+++ b/tests/test_merge.py
@@ -11,3 +11,7 @@ def test_disjoint():
 
 def test_empty():
     assert merge([]) == []
+
+
+def test_single_interval():
+    assert merge([[2, 5]]) == [[2, 5]]
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
pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_merge.py tests/test_merge_order.py
SWEBENCH_TEST_EXIT_CODE=$?
: '>>>>> End Test Output'
echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"
git checkout 0b73efefcd81ca0d2548593dccb16ed1fbb709ce -- tests/test_merge.py
