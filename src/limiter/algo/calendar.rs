//! UTC calendar months in integer microseconds, for `fixed_window` with `N/month`: which
//! month an instant falls in, and where that month starts and ends. Civil-date arithmetic after
//! Howard Hinnant's `days_from_civil` / `civil_from_days` (proleptic Gregorian, exact for every
//! day since 1970). Twin of the same functions in `lua/fixed_window.lua`.

use super::Params;

pub const DAY_US: u64 = 86_400_000_000;

/// (year, month 1..=12) of a day count since 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m)
}

/// Days since 1970-01-01 of the first day of `month` (1..=12) of `year` (≥ 1970).
fn days_from_civil(year: u64, month: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The window clients are told (`w` of `RateLimit-Policy`), in µs: the configured one, or
/// the length of the calendar month containing `now_us`.
pub fn window_at(p: &Params, now_us: u64) -> u64 {
    if p.month {
        let (_, start, end) = month_window(now_us);
        end - start
    } else {
        p.window_us
    }
}

/// The UTC month containing `now_us` (µs since the Unix epoch): its index (year·12 + month − 1,
/// increasing by one per month), its first and its next month's first microsecond.
pub fn month_window(now_us: u64) -> (u64, u64, u64) {
    let (y, m) = civil_from_days(now_us / DAY_US);
    let start = days_from_civil(y, m) * DAY_US;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let end = days_from_civil(ny, nm) * DAY_US;
    (y * 12 + m - 1, start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// µs of a UTC date at midnight, by counting days the slow way (independent of the above).
    fn date_us(year: u64, month: u64, day: u64) -> u64 {
        let leap = |y: u64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let len = |y: u64, m: u64| match m {
            2 if leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let mut days = 0;
        for y in 1970..year {
            days += if leap(y) { 366 } else { 365 };
        }
        for m in 1..month {
            days += len(year, m);
        }
        (days + day - 1) * DAY_US
    }

    #[test]
    fn every_month_from_1970_to_2200_starts_and_ends_where_the_calendar_says() {
        let mut previous = None;
        for year in 1970..2200 {
            for month in 1..=12 {
                let start = date_us(year, month, 1);
                let end = if month == 12 {
                    date_us(year + 1, 1, 1)
                } else {
                    date_us(year, month + 1, 1)
                };
                for now in [start, start + 1, start + 12 * 3_600_000_000, end - 1] {
                    let (k, s, e) = month_window(now);
                    assert_eq!((s, e), (start, end), "{year}-{month} at {now}");
                    if let Some(p) = previous {
                        assert!(k == p || k == p + 1, "index steps by one");
                    }
                    previous = Some(k);
                }
                assert_eq!(month_window(end).1, end, "the next month starts at `end`");
            }
        }
    }

    #[test]
    fn leap_februaries_and_month_lengths() {
        let feb = |y| {
            let (_, s, e) = month_window(date_us(y, 2, 10));
            (e - s) / DAY_US
        };
        assert_eq!(
            (feb(2024), feb(2025), feb(2000), feb(2100)),
            (29, 28, 29, 28)
        );
        let (_, s, e) = month_window(date_us(2026, 11, 23));
        assert_eq!((e - s) / DAY_US, 30);
        let (_, s, e) = month_window(date_us(2026, 12, 31) + 86_399_999_999);
        assert_eq!((s, e), (date_us(2026, 12, 1), date_us(2027, 1, 1)));
    }
}
