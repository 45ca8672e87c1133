//! The date a chat template sees: templates such as gpt-oss's call `strftime_now("%Y-%m-%d")`
//! and stamp it into every prompt. Candor renders a fixed calendar date instead of the clock
//! (a run records its date in the manifest, so a resume, `candor verify` or a rerun on another
//! day renders the same prompt), at midnight UTC. This module parses and formats that date; it
//! does not decide which date a run uses (that is `cli`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A calendar date (proleptic Gregorian), written `YYYY-MM-DD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TemplateDate {
    year: i32,
    month: u32,
    day: u32,
}

impl TemplateDate {
    /// The UTC date of a Unix time in seconds.
    pub fn from_unix(secs: u64) -> TemplateDate {
        let (year, month, day) = civil_from_days((secs / 86_400) as i64);
        TemplateDate { year, month, day }
    }

    /// Today's UTC date.
    pub fn today() -> TemplateDate {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        TemplateDate::from_unix(secs)
    }

    fn days(self) -> i64 {
        days_from_civil(self.year, self.month, self.day)
    }

    /// Formats the date like C's `strftime` at 00:00:00 UTC: `%Y %y %m %d %e %j %b %h %B %a
    /// %A %u %w %H %I %M %S %p %F %D %%`, and glibc's `%-d`, `%-m`, `%-e` without padding. Any
    /// other directive is an error naming it.
    pub fn strftime(self, format: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut chars = format.chars();
        let weekday = (self.days() + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
        let month = MONTHS[(self.month - 1) as usize];
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut d = chars.next().ok_or("a lone `%` at the end")?;
            let unpadded = d == '-';
            if unpadded {
                d = chars.next().ok_or("a lone `%-` at the end")?;
            }
            let num = |n: u32, width: usize| {
                if unpadded {
                    n.to_string()
                } else {
                    format!("{n:0width$}")
                }
            };
            match d {
                'Y' => out.push_str(&self.year.to_string()),
                'y' => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                'm' => out.push_str(&num(self.month, 2)),
                'd' => out.push_str(&num(self.day, 2)),
                'e' if unpadded => out.push_str(&self.day.to_string()),
                'e' => out.push_str(&format!("{:2}", self.day)),
                'j' => {
                    let yday = self.days() - days_from_civil(self.year, 1, 1) + 1;
                    out.push_str(&num(yday as u32, 3));
                }
                'b' | 'h' => out.push_str(&month[..3]),
                'B' => out.push_str(month),
                'a' => out.push_str(&WEEKDAYS[weekday][..3]),
                'A' => out.push_str(WEEKDAYS[weekday]),
                'u' => out.push_str(&(weekday + 1).to_string()),
                'w' => out.push_str(&((weekday + 1) % 7).to_string()),
                'H' | 'M' | 'S' => out.push_str(&num(0, 2)),
                'I' => out.push_str(&num(12, 2)),
                'p' => out.push_str("AM"),
                'F' => out.push_str(&self.to_string()),
                'D' => out.push_str(&format!(
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year.rem_euclid(100)
                )),
                '%' => out.push('%'),
                other => return Err(format!("strftime directive `%{other}` is not supported")),
            }
        }
        Ok(out)
    }
}

/// 1970-01-01 (only a placeholder for structures filled later).
impl Default for TemplateDate {
    fn default() -> Self {
        TemplateDate::from_unix(0)
    }
}

impl fmt::Display for TemplateDate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

impl FromStr for TemplateDate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a date YYYY-MM-DD");
        let mut parts = s.split('-');
        let (Some(y), Some(m), Some(d), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if y.len() != 4 || m.len() != 2 || d.len() != 2 {
            return Err(bad());
        }
        let year: i32 = y.parse().map_err(|_| bad())?;
        let month: u32 = m.parse().map_err(|_| bad())?;
        let day: u32 = d.parse().map_err(|_| bad())?;
        if !(1..=12).contains(&month) || day == 0 {
            return Err(bad());
        }
        // The day exists when it survives a round trip through the day count.
        if civil_from_days(days_from_civil(year, month, day)) != (year, month, day) {
            return Err(format!("{s:?}: no such day"));
        }
        Ok(TemplateDate { year, month, day })
    }
}

impl Serialize for TemplateDate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TemplateDate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01 (Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks_and_prints_dates() {
        let d: TemplateDate = "2026-11-26".parse().unwrap();
        assert_eq!(d.to_string(), "2026-11-26");
        assert!("2025-02-29"
            .parse::<TemplateDate>()
            .unwrap_err()
            .contains("no such day"));
        assert!("2024-02-29".parse::<TemplateDate>().is_ok());
        for bad in [
            "2026-1-26",
            "26-11-26",
            "2026-13-01",
            "2026-11-00",
            "2026/11/26",
            "x",
        ] {
            assert!(bad.parse::<TemplateDate>().is_err(), "{bad}");
        }
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, "\"2026-11-26\"");
        assert_eq!(serde_json::from_str::<TemplateDate>(&json).unwrap(), d);
    }

    #[test]
    fn unix_times_map_to_utc_dates() {
        assert_eq!(TemplateDate::from_unix(0).to_string(), "1970-01-01");
        // 2000-03-01T00:00:00Z and one second before it.
        assert_eq!(
            TemplateDate::from_unix(951_868_800).to_string(),
            "2000-03-01"
        );
        assert_eq!(
            TemplateDate::from_unix(951_868_799).to_string(),
            "2000-02-29"
        );
        assert_eq!(
            TemplateDate::from_unix(1_795_651_200).to_string(),
            "2026-11-26"
        );
    }

    /// The expected strings are what Python's `datetime(2026, 11, 26).strftime(f)` prints
    /// (glibc), the function transformers' `strftime_now` calls.
    #[test]
    fn strftime_like_c() {
        let d: TemplateDate = "2026-11-26".parse().unwrap();
        for (f, want) in [
            ("%Y-%m-%d", "2026-11-26"),
            ("%d %b %Y", "26 Nov 2026"),
            ("%A, %B %-d, %Y", "Thursday, November 26, 2026"),
            ("%a %y %j %u %w", "Thu 26 330 4 4"),
            ("%H:%M:%S %I %p %%", "00:00:00 12 AM %"),
            ("%F %D", "2026-11-26 11/26/26"),
        ] {
            assert_eq!(d.strftime(f).unwrap(), want, "{f}");
        }
        let early: TemplateDate = "2026-01-05".parse().unwrap();
        assert_eq!(early.strftime("%e|%-e|%-m|%m|%j").unwrap(), " 5|5|1|01|005");
        assert!(d.strftime("%Q").unwrap_err().contains("%Q"));
    }
}
