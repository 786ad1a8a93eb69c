-- Placeholder for migration 0007, which the execution-fencing work ships (issue 21, section
-- 1). It only keeps the migration files contiguous on this branch, so that 0008 (job family
-- isolation) can be applied and tested here; it changes nothing. The merge replaces this file
-- with the real 0007.
SELECT 1 AS placeholder;
