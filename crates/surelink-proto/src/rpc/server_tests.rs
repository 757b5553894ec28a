use super::*;

const A: Caller = Caller {
    node: NodeId(2),
    epoch: Epoch(1),
};

fn ms(m: u64) -> Time {
    Time::from_millis(m)
}

fn d() -> Dispatcher<&'static str> {
    Dispatcher::new(DispatcherConfig::default())
}

#[test]
fn resend_and_forward_are_high_and_go_first() {
    let mut s = d();
    assert_eq!(
        s.handle_request(ms(0), A, 1, RequestClass::Send, Priority::Normal, "s1"),
        None
    );
    assert_eq!(
        s.handle_request(ms(0), A, 2, RequestClass::Send, Priority::Normal, "s2"),
        None
    );
    assert_eq!(
        s.handle_request(ms(0), A, 3, RequestClass::Forward, Priority::Normal, "f3"),
        None
    );
    assert_eq!(
        s.handle_request(ms(0), A, 4, RequestClass::Send, Priority::High, "h4"),
        None
    );
    let order: Vec<&str> = std::iter::from_fn(|| s.next(ms(1)).map(|d| d.request)).collect();
    assert_eq!(order, vec!["f3", "h4", "s1", "s2"]);
}

#[test]
fn a_resend_of_a_queued_request_moves_it_to_the_head_and_runs_it_once() {
    let mut s = d();
    for id in 1..=5 {
        s.handle_request(ms(0), A, id, RequestClass::Send, Priority::Normal, "n");
    }
    s.handle_request(ms(0), A, 9, RequestClass::Send, Priority::High, "h");
    // Request 4 timed out at the caller and came again, three times.
    for _ in 0..3 {
        assert_eq!(
            s.handle_request(ms(2), A, 4, RequestClass::Resend, Priority::Normal, "dup"),
            Some(Duplicate::Queued)
        );
    }
    let ids: Vec<u64> = std::iter::from_fn(|| s.next(ms(3)).map(|d| d.id)).collect();
    assert_eq!(ids, vec![4, 9, 1, 2, 3, 5]);
    assert_eq!(s.executed(), 6);
    assert_eq!(s.duplicates(), 3);
}

#[test]
fn duplicates_of_running_and_finished_requests_are_answered_not_run() {
    let mut s = d();
    s.handle_request(ms(0), A, 1, RequestClass::Send, Priority::Normal, "r");
    let r = s.next(ms(0)).unwrap();
    assert_eq!(
        s.handle_request(ms(1), A, 1, RequestClass::Resend, Priority::Normal, "r"),
        Some(Duplicate::StillRunning)
    );
    s.complete(r.caller, r.id, Bytes::from_static(b"ok"));
    assert_eq!(
        s.handle_request(ms(2), A, 1, RequestClass::Resend, Priority::Normal, "r"),
        Some(Duplicate::Reply(Bytes::from_static(b"ok")))
    );
    assert!(s.next(ms(3)).is_none());
    assert_eq!(s.executed(), 1);
    // Another incarnation of the same node is another caller.
    let b = Caller {
        node: NodeId(2),
        epoch: Epoch(2),
    };
    assert_eq!(
        s.handle_request(ms(4), b, 1, RequestClass::Send, Priority::Normal, "new"),
        None
    );
}

#[test]
fn the_reply_cache_is_bounded_but_ids_are_remembered() {
    let mut s: Dispatcher<()> = Dispatcher::new(DispatcherConfig {
        reply_cache_entries: 2,
        reply_cache_bytes: 10,
        remember: 4,
        ..DispatcherConfig::default()
    });
    for id in 0..6u64 {
        s.handle_request(ms(0), A, id, RequestClass::Send, Priority::Normal, ());
        let r = s.next(ms(0)).unwrap();
        s.complete(r.caller, r.id, Bytes::from(vec![0u8; 4]));
    }
    // The last two replies are cached (8 bytes); 2 and 3 are remembered
    // without their reply; 0 and 1 are forgotten.
    let dup = |s: &mut Dispatcher<()>, id| {
        s.handle_request(ms(1), A, id, RequestClass::Resend, Priority::Normal, ())
    };
    assert!(matches!(dup(&mut s, 5), Some(Duplicate::Reply(_))));
    assert!(matches!(dup(&mut s, 4), Some(Duplicate::Reply(_))));
    assert_eq!(dup(&mut s, 3), Some(Duplicate::Answered));
    assert_eq!(dup(&mut s, 2), Some(Duplicate::Answered));
    assert_eq!(dup(&mut s, 1), None, "beyond the remembered window");
}

#[test]
fn forgetting_a_caller_drops_its_queue() {
    let mut s = d();
    s.handle_request(ms(0), A, 1, RequestClass::Send, Priority::Normal, "a");
    s.handle_request(ms(0), A, 2, RequestClass::Send, Priority::High, "b");
    assert_eq!(s.forget(A).len(), 2);
    assert_eq!(s.queued(), 0);
    assert!(s.next(ms(1)).is_none());
}

#[test]
fn fifo_mode_keeps_arrival_order() {
    let mut s: Dispatcher<u64> = Dispatcher::new(DispatcherConfig {
        fifo_only: true,
        ..DispatcherConfig::default()
    });
    s.handle_request(ms(0), A, 1, RequestClass::Send, Priority::Normal, 1);
    s.handle_request(ms(0), A, 2, RequestClass::Resend, Priority::High, 2);
    assert_eq!(s.next(ms(0)).map(|d| d.request), Some(1));
}
