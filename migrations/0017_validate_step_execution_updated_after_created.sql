-- Migration: validate step_execution_updated_after_created, added NOT VALID by the previous one.
--
-- In a transaction of its own, VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE: reads and
-- chunk commits go on while it scans. Every row already satisfied it as part of
-- step_execution_timestamp_order, and rows written since were checked as they were written;
-- this only records that the whole table has been proven.

ALTER TABLE pybatch.step_execution VALIDATE CONSTRAINT step_execution_updated_after_created;
