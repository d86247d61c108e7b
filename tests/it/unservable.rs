//! Deployments the sidecar refuses (Zero 1.10's v5 backups, a change log Zero does not write): the refusal in
//! `/status`, the metrics and `/keepalive`, cleanup held with the rows left in place, v4+ snapshot statuses
//! withheld, and the refusal clearing once its cause is gone. The LTX layout made by the real litestream 0.5 is
//! in `drills`, the LTX layout clearing in `backup`.
//!
//! Every case needs PostgreSQL: they are in [`pg`].

mod pg;
