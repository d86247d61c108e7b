//! `make bench`: figures for the targets the issues set, measured on this machine in one run, printed as a table.
//! Not a test: nothing here passes or fails, it reports (and flags a figure outside its target).
//! `cargo run --release --example bench -- relay` runs one section only.

mod relay;
mod reservations;
mod util;

fn main() {
    let only = std::env::args().nth(1);
    if only.as_deref() == Some("plain-relay") {
        let upstream = std::env::args()
            .nth(2)
            .expect("plain-relay <upstream address>");
        return relay::plain_relay_main(&upstream);
    }
    let runs = |section: &str| only.as_deref().map_or(true, |only| only == section);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut report = util::Report::default();
    runtime.block_on(async {
        if runs("reservations") {
            reservations::run(&mut report).await;
        }
        if runs("relay") {
            relay::run(&mut report).await;
        }
    });
    report.print();
}
