-- keiro 0029: the journal keeps `seq` without an index of its own.
--
-- `seq` orders an instance's entries (its writers hold the instance row, so per instance it is
-- the commit order), and every read of the journal is an instance's (its whole history or one
-- generation): `journal_step_key` finds those rows, and the sort by `seq` is over one run's
-- entries. No statement finds a journal row by `seq` alone, so its primary key index was
-- written on every step and read by nothing: a btree insertion and its WAL record a step, 7.5%
-- of a 48-step append batch's instructions in the server (`scripts/sql-cost append 48`:
-- 4,931,315 with it, 4,560,521 without). The identity still gives each entry its number.
ALTER TABLE journal DROP CONSTRAINT journal_pkey;

-- Without a primary key a publication that replicates deletes (a team's `FOR ALL TABLES`
-- publication, say) would refuse retention's cascade into the journal; the step key is unique
-- over NOT NULL columns, so it names each row for logical replication as the key did.
ALTER TABLE journal REPLICA IDENTITY USING INDEX journal_step_key;
