-- Migration 0013: validate the owner host constraints 0012 added NOT VALID.
--
-- In a transaction of its own, VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE: reads and
-- chunk commits go on while it scans. Every row 0012 found has no owner host, which the
-- constraints accept, and rows written since were checked as they were written.

ALTER TABLE pybatch.job_execution VALIDATE CONSTRAINT job_execution_owner_host_format;
ALTER TABLE pybatch.job_execution VALIDATE CONSTRAINT job_execution_owner_host_has_owner;
