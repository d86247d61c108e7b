//! `make bench`: figures for the targets the issues set, measured on this machine in one run, printed as a table.
//! Not a test: nothing here passes or fails, it reports (and flags a figure outside its target).
//!
//! Arguments name the sections to run (`cargo run --release --example bench -- purge relay`); none runs them all.

mod attack;
mod drill;
mod laggard;
mod metrics;
mod purge;
mod relay;
mod reservations;
mod slots;
mod util;
mod zero_stream;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The plain TCP relay the sidecar is compared with runs as its own process, like the sidecar.
    if args.first().map(String::as_str) == Some("plain-relay") {
        let upstream = args.get(1).expect("plain-relay <upstream address>");
        return relay::plain_relay_main(upstream);
    }
    // The restore drill's replica is built by a process of its own, which keeps its memory out of the figures.
    if args.first().map(String::as_str) == Some("drill-build") {
        return drill::build_main(&args[1..]);
    }
    // The attack section alone holds over 11,000 sockets.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let wanted = |section: &str| args.is_empty() || args.iter().any(|s| s == section);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut report = util::Report::default();
    runtime.block_on(async {
        // First, while this process is small: the drill measures its resident memory.
        if wanted("drill") {
            drill::run(&mut report).await;
        }
        if wanted("reservations") {
            reservations::run(&mut report).await;
        }
        if wanted("attack") {
            attack::run(&mut report).await;
        }
        if wanted("relay") {
            relay::run(&mut report, relay::Scope::All).await;
        } else if wanted("zero-traffic") {
            // The relay on Zero 1.9's recorded stream alone: quicker, for profiling.
            relay::run(&mut report, relay::Scope::ZeroTraffic).await;
        }
        if wanted("laggard") {
            laggard::run(&mut report).await;
        }
        if wanted("metrics") {
            metrics::run(&mut report).await;
        }
        if wanted("purge") {
            purge::run(&mut report).await;
        }
        if wanted("slots") {
            slots::run(&mut report).await;
        }
    });
    report.print();
}
