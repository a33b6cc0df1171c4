//! Durations (`250ms`, `5s`, `1m`, `2h`, `1d`) and rates (`100/s`, `5/1m`, `10/30s`).

use std::time::Duration;

/// Parse a whole-number duration with one unit: ms, s, m, h, d.
pub fn duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration `{s}`: expected a whole number and a unit (ms, s, m, h, d), e.g. `250ms` or `5s`"))?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => {
            return Err(format!(
                "invalid duration `{s}`: unknown unit `{unit}` (use ms, s, m, h or d)"
            ))
        }
    }
    .ok_or_else(|| format!("duration `{s}` is too large"))?;
    Ok(Duration::from_millis(ms))
}

/// A rate `N/WINDOW`: returns (N, window). A bare unit means one of it (`100/s` = `100/1s`).
pub fn rate(s: &str) -> Result<(u64, Duration), String> {
    let bad = || format!("invalid rate `{s}`: expected N/WINDOW such as `100/s`, `5/1m`, `10/30s`");
    let (n, w) = s.trim().split_once('/').ok_or_else(bad)?;
    let n: u64 = n.trim().parse().map_err(|_| bad())?;
    let w = w.trim();
    let window = if w.starts_with(|c: char| c.is_ascii_digit()) {
        duration(w)
    } else {
        duration(&format!("1{w}"))
    }
    .map_err(|e| format!("invalid rate `{s}`: {e}"))?;
    Ok((n, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(duration("1d").unwrap(), Duration::from_secs(86400));
        for bad in ["", "5", "s", "1.5s", "-1s", "5 sec", "5w"] {
            assert!(duration(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(rate("100/s").unwrap(), (100, Duration::from_secs(1)));
        assert_eq!(rate("5/1m").unwrap(), (5, Duration::from_secs(60)));
        assert_eq!(rate("1000/h").unwrap(), (1000, Duration::from_secs(3600)));
        assert_eq!(rate("10/30s").unwrap(), (10, Duration::from_secs(30)));
        assert_eq!(
            rate("50000/1d").unwrap(),
            (50000, Duration::from_secs(86400))
        );
        for bad in ["100", "/s", "x/s", "5/", "5/1x", "1.5/s"] {
            assert!(rate(bad).is_err(), "{bad} should fail");
        }
    }
}
