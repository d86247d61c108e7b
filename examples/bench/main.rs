//! `make bench`: figures for the targets the issues set, measured on this machine in one run, printed as a table.
//! Not a test: nothing here passes or fails, it reports (and flags a figure outside its target).

mod reservations;
mod util;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut report = util::Report::default();
    runtime.block_on(async {
        reservations::run(&mut report).await;
    });
    report.print();
}
