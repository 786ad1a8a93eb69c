-- Migration 0010: validate the failure reason constraints 0009 added NOT VALID.
--
-- In a transaction of its own, VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE: reads and
-- chunk commits go on while it scans. Every row 0009 found has NULL failure reasons, which the
-- constraints accept, and rows written since were checked as they were written; this only
-- records that the whole table has been proven.

ALTER TABLE pybatch.job_execution VALIDATE CONSTRAINT job_execution_failure_error_class_length;
ALTER TABLE pybatch.job_execution VALIDATE CONSTRAINT job_execution_failure_message_length;
ALTER TABLE pybatch.job_execution VALIDATE CONSTRAINT job_execution_failure_sqlstate_format;
ALTER TABLE pybatch.job_execution VALIDATE CONSTRAINT job_execution_failure_names_length;
ALTER TABLE pybatch.job_execution VALIDATE CONSTRAINT job_execution_failure_reason_whole;
ALTER TABLE pybatch.step_execution VALIDATE CONSTRAINT step_execution_failure_error_class_length;
ALTER TABLE pybatch.step_execution VALIDATE CONSTRAINT step_execution_failure_message_length;
ALTER TABLE pybatch.step_execution VALIDATE CONSTRAINT step_execution_failure_sqlstate_format;
ALTER TABLE pybatch.step_execution VALIDATE CONSTRAINT step_execution_failure_names_length;
ALTER TABLE pybatch.step_execution VALIDATE CONSTRAINT step_execution_failure_reason_whole;
