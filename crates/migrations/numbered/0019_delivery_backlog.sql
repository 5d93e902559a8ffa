-- keiro 0019: deliveries that no await has read are bounded per generation.
--
-- A delivery (`deliver`) is journaled whether or not any await will ever read it, so a caller
-- delivering under fresh names (a public webhook) grew a journal that every drive loads, and
-- filled the run's journal budget (its next step failed with JournalFull). The instance row
-- now keeps, for one generation, what `keiro_delivery_append` journaled (count and encoded
-- bytes, as the caller measures them) and how much of it the run reported its awaits read; a
-- delivery that would take the difference past the caller's bound is refused, unless it
-- answers a wait the run's last park waits on (`parked_on`, written by every park on the
-- current generation and cleared by a continue-as-new).
--
-- The counters describe `deliveries_generation` only: on any other generation they count as
-- empty, so continuing as new resets no counter. All are NULL until an instance gets its
-- first delivery (NULL counts as 0), and `parked_on` stays NULL for a park that waits on no
-- delivery: a row that never sees one pays nothing but its null bitmap.
--
-- The functions this version added or changed live in sql/functions/ (journal.sql,
-- instance.sql).

ALTER TABLE workflows
    ADD COLUMN deliveries_generation integer,
    ADD COLUMN deliveries            integer,
    ADD COLUMN deliveries_bytes      bigint,
    ADD COLUMN deliveries_read       integer,
    ADD COLUMN deliveries_read_bytes bigint,
    ADD COLUMN parked_on             text[];
