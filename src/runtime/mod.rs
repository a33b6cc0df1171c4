//! The running process: boot (`app`), listeners (`server`), live reload (`reload`) and what a
//! loaded table is served with (`live`).

pub mod app;
pub mod live;
pub mod reload;
pub mod server;

pub use live::Live;
