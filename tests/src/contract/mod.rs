//! The store contract suite: every rule a store must keep, as plain scenario functions that
//! take a [`Harness`](crate::Harness), run on every store by one macro.
//!
//! One module per file of `sql/functions/` (`journal`, `instance`, `lease`, `timer`, `signal`,
//! `awakeable`, `child`, `remote`, `queue`, `message`, `attribute`), plus `retention`, `inspect` and `schedule`; inside each,
//! one file per behaviour. A scenario is `pub async fn name(h: Harness) -> TestResult`, uses
//! only what every store offers (the store traits, the facade, the harness's tools) and
//! branches on [`Backend`](crate::Backend) only where the stores are allowed to differ.
//!
//! [`contract_suite!`](crate::contract_suite) expands the whole suite for one store:
//!
//! ```ignore
//! keiro_tests::contract_suite!(postgres => keiro_tests::Harness::postgres().await);
//! keiro_tests::contract_suite!(sqlite => keiro_tests::Harness::sqlite());
//! ```
//!
//! The test binary `tests/tests/contract.rs` invokes it once per store, so a test is named
//! `<store>::<module>::<file>::<scenario>` (`postgres::journal::replay::start_is_idempotent_by_id`).
//! A new store joins with a [`Harness`](crate::Harness) constructor and one line there; a new
//! scenario is a `pub async fn` here and one line in the macro's list.
//!
//! What is true of one store alone stays with that store: query plans, round trips, lock races
//! held with a test transaction, search_path, TLS, LISTEN health, migrations and function files
//! in `crates/postgres/tests/postgres/`; the SQLite file's opening, locking, pragmas, group
//! commit, notification polling and several stores on one file in `crates/sqlite/tests/sqlite/`.

// A scenario's name says what it checks; its opening comment says how.
#![allow(missing_docs)]

pub mod attribute;
pub mod awakeable;
pub mod child;
pub mod inspect;
pub mod instance;
pub mod journal;
pub mod lease;
pub mod message;
pub mod payloads;
pub mod queue;
pub mod remote;
pub mod retention;
pub mod schedule;
pub mod signal;
pub mod support;
pub mod timer;
pub mod versions;

/// Generates one `#[tokio::test]` per contract scenario for one store, inside `mod $store`:
/// `$store::<module>::<file>::<scenario>`, each calling the scenario with the harness that
/// `$harness` (an expression, evaluated inside the async test, so `.await` may end it) makes.
#[macro_export]
macro_rules! contract_suite {
    ($store:ident => $harness:expr) => {
        $crate::contract_suite!(@suite $store => $harness;
            journal {
                append [
                    steps_converge_on_the_first_record_and_kinds_conflict,
                    terminal_rows_refuse_steps_and_other_markers,
                    failures_repeat_after_resurrection_under_unique_names,
                    continue_as_new_moves_the_generation_and_a_retry_converges,
                    fenced_appends_need_the_current_lease_and_renew_it,
                    terminal_rows_refuse_with_their_own_marker_and_repeat_it_as_already_present,
                    terminal_refusal_comes_before_the_fence_check,
                    a_recorded_step_is_already_present_even_after_the_instance_closed,
                    only_the_current_holder_may_append_and_its_append_renews,
                    writers_on_an_old_generation_converge_or_conflict,
                    resurrected_is_not_appendable_and_missing_instances_are_not_found,
                    a_fenced_step_renews_the_lease_only_once_it_is_no_longer_fresh,
                    a_cancelled_marker_settles_the_generations_tasks_and_awakeables,
                ],
                replay [
                    journaled_steps_never_run_again,
                    repeated_step_name_reuses_the_first_result,
                    first_run_returns_the_json_round_trip,
                    start_is_idempotent_by_id,
                    racing_writers_converge_on_one_result,
                    racing_runs_converge_on_one_result,
                    appends_after_failed_or_cancelled_are_refused,
                    late_append_never_resurrects_a_terminal_row,
                    completion_and_cancellation_have_one_winner,
                    cancel_stops_the_run_at_its_next_boundary,
                    cancel_is_idempotent_and_refuses_unknown_instances,
                    renamed_step_is_caught_as_non_determinism,
                    removed_step_is_caught_when_the_body_returns,
                    kind_mismatch_is_caught_as_non_determinism,
                    concurrent_steps_in_a_join_are_not_divergence,
                    await_suspends_and_resumes_with_the_delivered_value,
                    duplicate_delivery_is_idempotent,
                    wake_before_park_is_never_masked,
                    undecodable_recorded_value_is_a_typed_error,
                    oversized_payloads_are_refused_and_lose_nothing,
                    panicking_step_is_a_crash_not_a_process_abort,
                    patched_takes_old_branch_in_flight_and_new_branch_fresh,
                    continue_as_new_bounds_the_journal,
                ],
                group_commit [
                    each_append_of_a_batch_keeps_its_own_outcome,
                    each_completion_of_a_batch_keeps_its_own_outcome,
                    a_refused_value_fails_only_its_own_append,
                    duplicates_in_a_batch_converge_on_the_first_value,
                    appends_to_one_instance_keep_their_order_in_a_batch,
                    a_cancel_in_a_batch_keeps_its_place,
                    concurrent_batches_over_many_instances_record_each_step_once,
                    concurrent_single_appends_each_get_their_outcome,
                    start_many_answers_each_item,
                    concurrent_starts_create_each_instance_once,
                    concurrent_direct_starts_lease_each_instance_once,
                    a_closing_pair_journals_its_step_and_completes,
                    a_closing_pair_completes_only_over_its_own_value,
                    a_closing_pair_refused_writes_nothing_more,
                    concurrent_closing_pairs_and_appends_each_get_their_outcome,
                ],
                refused_values [
                    a_start_with_a_refused_input_creates_nothing,
                    a_refused_step_result_is_not_journaled,
                    a_refused_output_or_failure_reason_leaves_the_run_open,
                    a_refused_delivery_is_not_journaled,
                    a_refused_signal_is_neither_delivered_nor_buffered,
                    a_refused_awakeable_payload_leaves_it_pending,
                    a_crash_with_a_refused_error_text_is_not_recorded,
                    a_refused_remote_report_leaves_the_task_unsettled,
                    refused_child_and_remote_inputs_write_nothing,
                    a_refused_output_fails_its_step_and_the_rest_of_its_batch_lands,
                ],
                last_step [
                    the_last_step_and_the_completion_are_one_store_call,
                    a_held_back_step_is_journaled_before_the_body_waits_on_anything_else,
                    a_held_back_step_meeting_another_value_never_completes_the_run,
                    a_stale_lease_writes_neither_the_last_step_nor_the_completion,
                    a_held_back_step_is_timed_to_the_end_of_its_append,
                    a_context_call_dropped_while_it_sends_a_held_back_step_loses_nothing,
                    a_body_returning_after_dropping_that_call_still_journals_the_step,
                ],
                deliveries [
                    a_delivery_before_the_body_runs_a_step_of_that_name_changes_nothing,
                    a_delivery_to_a_step_the_body_recorded_changes_nothing,
                    an_early_delivery_waits_for_its_await,
                    a_value_delivered_under_the_bare_name_is_still_read,
                    a_delivery_bound_to_a_left_generation_is_refused,
                    deliveries_no_await_reads_do_not_fill_the_journal_budget,
                    a_delivery_past_the_unread_bound_is_refused_and_writes_nothing,
                    what_the_awaits_read_makes_room_and_a_parked_wait_is_always_answered,
                    the_unread_bytes_are_bounded_too,
                    a_new_generation_starts_with_no_unread_delivery,
                    the_unread_bound_counts_only_what_the_awaits_reported_read,
                    only_an_unfenced_await_record_is_a_delivery_and_a_closed_run_gets_no_backlog,
                ],
            },
            instance {
                start [
                    start_is_idempotent_and_notifies_only_on_create,
                    many_starts_answer_in_order_and_a_started_child_names_its_parent,
                ],
                cancel [
                    a_cascade_cancels_every_live_descendant,
                    without_cascade_only_the_instance_is_cancelled,
                    cancelling_a_subtree_notifies_its_parent,
                    a_finished_or_missing_instance_is_not_cancelled,
                    a_cycle_of_adoptions_does_not_loop,
                    a_cascading_cancel_reaches_every_live_descendant_only,
                ],
                settle [
                    a_completed_runs_leftovers_are_settled_once_and_only_then,
                ],
            },
            lease {
                claim [
                    a_claim_carries_the_row_and_the_current_journal,
                    refusals_are_classified_and_leases_fence,
                    crashes_back_off_then_fail_with_a_journaled_marker,
                    parking_never_masks_a_wake_and_discovery_is_exact,
                    discovery_orders_by_priority_then_age,
                    a_diverged_run_fails_without_a_journal_row,
                    racing_claims_grant_exactly_one_lease,
                    claims_carry_the_journal_in_append_order,
                    a_batch_claim_takes_discovery_order_for_the_names_asked_and_skips_held_rows,
                    a_direct_start_is_leased_at_once_and_claims_only_what_a_worker_could,
                ],
                lifecycle [
                    refusals_are_classified_lease_first_and_claims_carry_the_current_generation,
                    release_renew_and_force_release_are_fenced,
                    resurrection_keeps_history_and_wakes_the_run_each_time,
                    confirm_renews_the_lease_and_refuses_a_stale_fence_or_a_missing_instance,
                ],
                park [
                    a_park_never_masks_a_wake_that_landed_first,
                    parks_and_divergence_respect_terminal_rows_and_fences,
                ],
                refuse [
                    refusals_gate_the_next_claim_and_never_spend_the_crash_budget,
                    a_refusal_is_fenced_and_leaves_a_finished_run_alone,
                    every_kind_of_progress_resets_the_refusals,
                ],
            },
            timer {
                arm [
                    the_first_arm_wins_and_alone_notifies,
                    arming_needs_the_instance,
                    racing_arms_agree_on_one_deadline,
                    a_span_is_due_from_the_stores_clock_and_cut_to_the_longest_span,
                ],
                fire [
                    a_due_sleep_journals_its_step_wakes_the_owner_and_clears_its_deadline,
                    fires_oldest_first_up_to_the_limit_and_reports_the_next_due,
                    a_fire_that_cannot_journal_is_marked_fired_undelivered,
                    timers_arm_once_and_fire_by_the_callers_clock_in_due_order,
                    a_fire_journals_nothing_for_a_terminal_owner_or_a_journaled_step,
                ],
                fire_concurrent [
                    concurrent_callers_fire_each_timer_once,
                    many_workers_in_small_batches_fire_each_timer_once,
                ],
            },
            signal {
                send [
                    buffered_signals_are_consumed_first_in_first_out,
                    waiters_are_served_in_arrival_order_and_dead_ones_are_passed_over,
                    consuming_a_buffered_signal_is_fenced,
                    a_terminal_waiter_leaves_the_buffer_alone,
                    a_pending_wait_times_out_and_a_satisfied_one_does_not,
                    a_withdrawn_wait_is_passed_over_by_the_next_send,
                    buffered_signals_are_consumed_oldest_first_by_later_waits,
                    a_send_goes_to_the_oldest_live_waiter_and_wakes_it,
                    a_signal_timeout_fires_only_while_the_wait_is_pending,
                    a_wait_on_a_token_no_send_could_use_is_refused,
                ],
                race [
                    wait_then_send_races_deliver_exactly_once,
                    send_then_wait_races_deliver_exactly_once,
                    spawned_racers_on_separate_tasks_deliver_exactly_once,
                    timeouts_and_sends_racing_on_one_token_lose_nothing,
                    many_waits_and_sends_on_one_token_deliver_each_signal_once,
                ],
            },
            child {
                delivery [
                    a_spawn_creates_the_linked_child_once,
                    completion_delivers_the_output,
                    failure_delivers_the_reason,
                    the_crash_ceiling_delivers_the_last_error,
                    divergence_delivers_the_reason,
                    cancellation_delivers_the_cancelled_envelope,
                    continue_as_new_delivers_nothing_until_the_run_ends,
                    a_parent_that_cannot_take_the_result_is_ignored,
                    spawning_an_existing_instance_adopts_it_or_delivers_its_result,
                    every_terminal_path_of_a_child_journals_its_envelope_into_the_parent,
                    a_spawn_adopts_an_existing_instance_and_a_closed_parent_refuses_quietly,
                ],
            },
            remote {
                arm [
                    arming_is_idempotent_and_learns_the_result,
                    concurrent_arms_of_one_step_write_one_task,
                    a_passed_deadline_redispatches_until_the_step_is_lost,
                    a_lost_step_wakes_its_owner,
                    a_passed_deadline_counts_the_expired_claim_it_drops,
                    a_park_dispatch_writes_its_tasks_and_wakes_by_the_first_deadline,
                    parks_sent_at_once_each_get_their_own_answer,
                    an_arm_journals_a_result_its_owner_could_not_take,
                ],
                claim [
                    concurrent_claimers_never_take_the_same_task,
                    claims_go_by_priority_then_age_across_groups,
                    an_expired_claim_is_claimable_again_and_its_holder_is_stale,
                    the_last_expired_claim_fails_the_step_as_crashed_and_wakes_the_owner,
                    a_claim_leaves_the_expired_claims_of_other_groups_alone,
                    a_heartbeat_extends_only_the_current_claim,
                ],
                report [
                    completion_is_idempotent_and_wakes_a_suspended_owner,
                    a_completion_without_a_claim_wins_and_a_gone_owner_is_reported,
                    retryable_failures_back_off_and_the_last_one_is_journaled,
                    a_retry_counts_the_redispatch_deadline_from_the_end_of_its_backoff,
                    a_failure_that_is_not_retryable_fails_at_once,
                    a_failure_of_a_pending_task_is_stale,
                    a_batch_of_reports_answers_each_in_the_callers_order,
                ],
                cancel [
                    a_cancel_cancels_the_live_tasks_of_the_run_and_refuses_their_reports,
                    a_continue_as_new_cancels_the_tasks_of_the_generation_it_leaves,
                ],
                requeue [
                    redispatch_pending_counts_the_open_tasks_of_the_current_generation,
                    a_requeue_resets_a_failed_remote_step,
                    a_requeue_cascades_to_a_failed_child_which_then_delivers_to_the_next_revision,
                    a_requeue_guards_a_cycle_of_parent_links,
                    a_fix_copies_the_parent_link_and_delivers_only_its_success,
                    a_requeue_journals_a_fix_that_already_completed,
                    a_requeue_resets_failures_in_journal_order,
                    a_requeue_cascades_down_the_tree_and_relinks_every_level,
                    a_requeue_delivers_a_success_the_failed_parent_could_not_take,
                    a_handled_child_failure_is_not_reset_unless_the_run_failed_on_it,
                ],
                queue [
                    concurrency_holds_across_groups_and_workers,
                    worker_concurrency_counts_each_remote_worker_alone,
                    key_concurrency_admits_other_keys_past_a_busy_one,
                    weighted_fairness_interleaves_the_keys,
                    a_rate_limit_counts_first_claims_over_a_window,
                    a_slot_comes_back_on_completion_failure_and_claim_expiry,
                    a_paused_queue_gives_no_task_until_resumed,
                    runs_and_steps_share_one_queues_limits,
                    an_undeclared_queue_is_refused_and_nothing_is_written,
                ],
            },
            awakeable {
                settle [
                    completion_delivers_once_and_repeats_are_idempotent,
                    cancellation_delivers_the_cancelled_envelope,
                    racing_completions_settle_once,
                    a_terminal_owner_gets_nothing_journaled,
                    creation_is_fenced_and_refused_on_a_terminal_owner,
                    awakeables_settle_once_and_never_journal_into_a_terminal_owner,
                ],
            },
            message {
                event [
                    a_set_event_is_read_at_once_and_the_latest_value_wins,
                    a_stale_holder_sets_nothing,
                    a_reader_waiting_for_the_first_value_is_woken_by_push,
                    a_terminal_run_without_the_event_answers_none_at_once,
                    bad_event_requests_are_typed_errors,
                    a_body_sets_events_once_whatever_replays_it,
                ],
                stream [
                    appends_are_numbered_without_gaps_and_read_from_any_offset,
                    a_close_ends_readers_and_refuses_later_appends,
                    a_run_that_ends_ends_its_streams,
                    budgets_refuse_with_typed_outcomes_and_write_nothing,
                    a_stale_holder_appends_nothing,
                    retention_deletes_events_and_streams_with_their_instance,
                    bad_stream_requests_are_typed_errors,
                    a_body_appends_each_item_once_whatever_replays_it,
                ],
                update [
                    an_update_is_taken_in_order_answered_once_and_a_resend_gets_the_answer,
                    a_send_wakes_the_run_parked_on_its_take,
                    an_update_to_an_unknown_or_finished_run_is_refused_and_a_run_that_ends_settles_its_updates,
                    bad_update_requests_are_typed_outcomes_and_write_nothing,
                    update_and_signal_with_start_start_and_deliver_in_one_call,
                ],
            },
            attribute {
                set [
                    a_start_writes_its_attributes_only_when_it_creates_the_instance,
                    bad_start_attributes_are_typed_errors_and_start_nothing,
                    a_set_is_journaled_once_and_the_latest_value_wins,
                    a_stale_holder_sets_nothing,
                    a_set_past_the_bound_is_refused_and_writes_nothing,
                    retention_deletes_attributes_with_their_instance,
                    a_body_sets_attributes_once_whatever_replays_it,
                    starts_that_keep_no_attributes_refuse_them_and_start_nothing,
                ],
                list [
                    attribute_filters_select_what_matches_selects_in_pages_of_both_orders,
                    bad_attribute_filters_are_typed_errors,
                ],
            },
            versions {
                claims [
                    runs_record_the_version_of_the_store_that_started_them,
                    a_claim_takes_only_the_runs_of_the_versions_it_serves,
                    a_claim_of_one_run_of_another_version_is_refused_and_changes_nothing,
                    queue_admission_takes_only_the_runs_of_the_versions_it_serves,
                    continue_as_new_records_the_version_that_continued_the_run,
                    a_child_records_the_version_of_the_worker_that_spawned_it,
                ],
                moves [
                    a_move_hands_the_live_runs_of_a_version_to_another,
                ],
                workers [
                    heartbeats_are_written_refreshed_listed_and_removed,
                    runs_of_a_version_no_live_worker_serves_are_found,
                    rows_of_workers_not_seen_for_a_while_are_forgotten,
                ],
            },
            payloads {
                rewrite [
                    payloads_are_read_with_their_places_and_rewritten_only_where_unchanged,
                ],
            },
            retention {
                collect [
                    gc_deletes_expired_terminal_instances_and_keeps_the_rest,
                    batches_are_bounded_and_gc_runs_them_until_done,
                    a_worker_with_retention_collects,
                    a_parent_that_finished_first_goes_after_its_child,
                    a_parent_stays_while_a_grandchild_lives,
                    a_bounded_batch_takes_the_oldest_terminal_first,
                ],
            },
            inspect {
                list [
                    list_filters_and_pages_add_up,
                    bad_list_requests_are_typed_errors,
                    counts_show_statuses_timers_and_remote_backlog,
                ],
                reads [
                    every_filter_selects_what_matches_row_selects_in_pages_of_both_orders,
                    a_full_last_page_has_no_next_cursor_and_a_cursor_names_the_last_row_shown,
                    counts_split_the_timer_backlog_at_the_given_instant_and_tasks_by_group,
                ],
                throughput [
                    throughput_counts_terminal_instances_per_bucket_of_the_window,
                    bad_throughput_requests_are_typed_errors,
                ],
                waits [
                    waits_follow_timers_awakeables_and_signal_waits,
                    a_cancelled_run_shows_its_awakeables_cancelled,
                    waits_are_newest_first_and_bounded,
                    bad_waits_requests_are_typed_errors,
                ],
            },
            schedule {
                scheduler [
                    a_running_fleet_runs_each_services_schedules,
                    a_schedule_that_cannot_start_records_its_error_and_backs_off,
                    a_refused_start_is_recorded_and_retried_without_blocking_the_others,
                    a_fleet_of_two_services_starts_every_schedule_whoever_leads,
                    schedules_no_worker_registers_never_hold_up_one_it_does,
                    ticks_while_down_follow_each_catch_up_policy,
                    skip_overlap_drops_ticks_while_the_previous_run_is_live,
                    buffer_one_starts_the_kept_tick_when_the_previous_run_ends,
                    allow_all_overlap_starts_every_tick,
                    two_schedulers_racing_start_each_tick_exactly_once,
                    a_dead_leaders_successor_starts_the_ticks_it_missed_once,
                    pause_skips_ticks_and_resume_does_not_catch_them_up,
                    trigger_starts_one_run_now_whatever_the_policy,
                    a_daily_0230_in_berlin_on_both_daylight_saving_days,
                    an_unregistered_workflow_starts_and_waits_for_a_worker_that_has_it,
                    bad_definitions_are_typed_errors,
                ],
                store [
                    upsert_get_list_and_delete_keep_the_revision_rules,
                    the_scheduler_lease_is_one_owners_and_its_epoch_moves_only_with_the_holder,
                    a_fire_starts_its_runs_with_the_row_or_writes_nothing,
                    due_schedules_come_earliest_first_without_the_paused_or_backed_off,
                    pause_keeps_the_tick_resume_skips_and_trigger_starts_now,
                ],
            },
            queue {
                start [
                    a_run_on_a_queue_waits_for_admission_not_for_an_ordinary_claim,
                    bad_queue_values_are_typed_errors_and_write_nothing,
                    dedup_refuses_or_returns_the_holder_while_it_is_live,
                    concurrent_starts_with_one_dedup_id_create_one_run,
                    start_many_with_starts_each_item_on_its_queue_and_refuses_alone,
                    a_batch_on_one_queue_answers_each_item_as_a_start_alone,
                ],
                admit [
                    concurrency_holds_across_owners_and_a_slot_comes_back_at_the_end,
                    worker_concurrency_counts_each_owner_alone,
                    key_concurrency_admits_other_keys_past_a_busy_one,
                    rate_limits_first_admissions_over_a_sliding_window,
                    key_rate_limits_each_key_alone,
                    a_paused_queue_admits_nothing_until_resumed,
                    a_delayed_start_waits_for_its_time_and_shows_as_delayed,
                    a_workers_claim_takes_ordinary_runs_first_and_admits_with_the_room_left,
                ],
                order [
                    priority_orders_admission_when_the_queue_takes_it,
                    round_robin_serves_a_small_key_behind_a_large_backlog,
                    weighted_fairness_shares_admissions_by_weight,
                    a_small_key_is_served_by_its_share_behind_ten_thousand_runs_of_another,
                ],
                slots [
                    a_parked_run_gives_its_slot_back_or_keeps_it_as_its_queue_says,
                    a_recorded_crash_gives_the_slot_back,
                    an_expired_lease_gives_the_slot_back_and_fences_the_old_holder,
                    an_ended_run_frees_its_slot_and_dedup_id_and_a_resurrected_one_waits_again,
                ],
                fleet [
                    a_fleet_of_workers_never_exceeds_the_queue_limits,
                ],
                light [
                    a_queue_that_counts_nothing_leases_its_runs_and_shows_them_running,
                    a_limit_declared_later_counts_the_runs_the_queue_leased,
                    only_a_worker_serving_the_queue_claims_its_free_runs,
                    a_paused_queue_that_counts_nothing_holds_its_runs_until_resumed,
                    a_run_back_from_its_end_waits_under_the_limits_of_its_return,
                ],
                debounce [
                    calls_in_a_burst_share_one_run_that_starts_quiet_with_the_last_input,
                    the_maximum_wait_starts_a_burst_however_often_it_is_pushed,
                    concurrent_calls_of_one_key_make_one_run,
                ],
            },

        );
    };
    (@suite $store:ident => $harness:expr;
        $($group:ident { $($file:ident [ $($name:ident),* $(,)? ]),* $(,)? }),* $(,)?
    ) => {
        mod $store {
            $(
                mod $group {
                    $(
                        mod $file {
                            $(
                                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                                async fn $name() -> $crate::TestResult {
                                    $crate::contract::$group::$file::$name($harness).await
                                }
                            )*
                        }
                    )*
                }
            )*
        }
    };
}
