//! [`RateLimits`]: per user, per token and per client address (S13), each a keyed GCRA limiter from
//! governor, answering with how long to wait (for `Retry-After`).
// enforces: S13

use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agenthold_core::UserId;
use governor::clock::Clock as _;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::config::AuthConfig;

/// Every this many checks, keys whose limiter is back to full are dropped, so memory stays proportional
/// to the callers of the last few seconds.
const RETAIN_EVERY: u64 = 1024;

/// Bursts are this many times the per-second rate.
const BURST_FACTOR: u32 = 4;

/// Rate limits per user, per token id and per client address (the last for unauthenticated requests and
/// failed logins). A rate of 0 in [`AuthConfig`] turns that limit off.
///
/// IPv6 clients are limited per /64 (one host usually has a whole /64); IPv4-mapped IPv6 addresses count
/// as the IPv4 address.
pub struct RateLimits {
    user: Option<DefaultKeyedRateLimiter<UserId>>,
    token: Option<DefaultKeyedRateLimiter<String>>,
    address: Option<DefaultKeyedRateLimiter<IpAddr>>,
    checks: AtomicU64,
}

impl fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimits")
            .field("user", &self.user.is_some())
            .field("token", &self.token.is_some())
            .field("address", &self.address.is_some())
            .finish_non_exhaustive()
    }
}

impl RateLimits {
    /// Limits with the rates of `config`.
    #[must_use]
    pub fn new(config: &AuthConfig) -> Self {
        Self {
            user: limiter(config.rate_per_user),
            token: limiter(config.rate_per_token),
            address: limiter(config.rate_unauthenticated),
            checks: AtomicU64::new(0),
        }
    }

    /// Count one request of `user`; `Err` holds how long until it would be allowed.
    ///
    /// # Errors
    /// The wait, when the user is over their rate.
    pub fn check_user(&self, user: &UserId) -> Result<(), Duration> {
        self.check(self.user.as_ref(), user)
    }

    /// Count one request made with the token `token_id` (its id, not its value).
    ///
    /// # Errors
    /// The wait, when the token is over its rate.
    pub fn check_token(&self, token_id: &str) -> Result<(), Duration> {
        self.check(self.token.as_ref(), &token_id.to_owned())
    }

    /// Count one unauthenticated request or failed login from `address`.
    ///
    /// # Errors
    /// The wait, when the address is over its rate.
    pub fn check_address(&self, address: IpAddr) -> Result<(), Duration> {
        self.check(self.address.as_ref(), &address_key(address))
    }

    fn check<K: Clone + Eq + Hash>(
        &self,
        limiter: Option<&DefaultKeyedRateLimiter<K>>,
        key: &K,
    ) -> Result<(), Duration> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % RETAIN_EVERY == RETAIN_EVERY - 1 {
            self.retain_recent();
        }
        let Some(limiter) = limiter else {
            return Ok(());
        };
        limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(limiter.clock().now()))
    }

    /// Drop the keys whose limiter is back to full.
    fn retain_recent(&self) {
        if let Some(l) = &self.user {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.token {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.address {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    /// How many keys the limiters hold (for tests of the memory bound).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.user.as_ref().map_or(0, RateLimiter::len)
            + self.token.as_ref().map_or(0, RateLimiter::len)
            + self.address.as_ref().map_or(0, RateLimiter::len)
    }
}

/// A keyed limiter at `per_second` with bursts of [`BURST_FACTOR`] times that; `None` for 0.
fn limiter<K: Clone + Eq + Hash>(per_second: u32) -> Option<DefaultKeyedRateLimiter<K>> {
    let rate = NonZeroU32::new(per_second)?;
    let burst = rate.saturating_mul(NonZeroU32::new(BURST_FACTOR)?);
    Some(RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst)))
}

/// The key of a client address: IPv4 as is, IPv4-mapped IPv6 as IPv4, other IPv6 cut to its /64.
fn address_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn config(rate: u32) -> AuthConfig {
        AuthConfig {
            rate_per_user: rate,
            rate_per_token: rate,
            rate_unauthenticated: rate,
            ..AuthConfig::default()
        }
    }

    /// Check until refused; returns how many were allowed and the wait of the refusal.
    fn exhaust(mut check: impl FnMut() -> Result<(), Duration>) -> (u32, Duration) {
        for allowed in 0..10_000 {
            if let Err(wait) = check() {
                return (allowed, wait);
            }
        }
        (10_000, Duration::ZERO)
    }

    // covers: S13
    #[test]
    fn each_limit_refuses_after_its_burst_with_a_retry_after() -> Result<(), agenthold_core::Error> {
        let limits = RateLimits::new(&AuthConfig {
            rate_per_user: 2,
            rate_per_token: 3,
            rate_unauthenticated: 1,
            ..AuthConfig::default()
        });
        let alice = UserId::new("alice")?;
        let bob = UserId::new("bob")?;
        let (allowed, wait) = exhaust(|| limits.check_user(&alice));
        assert_eq!(allowed, 8, "burst is 4 x 2");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        // Another user has their own budget.
        assert!(limits.check_user(&bob).is_ok());
        let (allowed, wait) = exhaust(|| limits.check_token("t1"));
        assert_eq!(allowed, 12);
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(334),
            "{wait:?}"
        );
        assert!(limits.check_token("t2").is_ok());
        let addr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
        let (allowed, wait) = exhaust(|| limits.check_address(addr));
        assert_eq!(allowed, 4);
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(
            limits
                .check_address(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8)))
                .is_ok()
        );
        Ok(())
    }

    // covers: S13
    #[test]
    fn ipv6_clients_share_their_slash_64_and_mapped_ipv4_is_ipv4() -> Result<(), std::net::AddrParseError> {
        let limits = RateLimits::new(&config(1));
        let v6: IpAddr = "2001:db8:1:2::1".parse()?;
        let (allowed, _) = exhaust(|| limits.check_address(v6));
        assert_eq!(allowed, 4);
        assert!(limits.check_address("2001:db8:1:2:ffff::9".parse()?).is_err());
        assert!(limits.check_address("2001:db8:1:3::1".parse()?).is_ok());
        let v4: IpAddr = "192.0.2.1".parse()?;
        let (allowed, _) = exhaust(|| limits.check_address(v4));
        assert_eq!(allowed, 4);
        assert!(limits.check_address("::ffff:192.0.2.1".parse()?).is_err());
        Ok(())
    }

    #[test]
    fn zero_turns_a_limit_off() -> Result<(), agenthold_core::Error> {
        let limits = RateLimits::new(&config(0));
        let alice = UserId::new("alice")?;
        for _ in 0..1000 {
            assert!(limits.check_user(&alice).is_ok());
            assert!(limits.check_token("t").is_ok());
            assert!(limits.check_address(IpAddr::V4(Ipv4Addr::LOCALHOST)).is_ok());
        }
        Ok(())
    }

    // covers: S13
    #[test]
    fn keys_back_to_full_are_dropped() {
        // At 1000/s with bursts of 4000, one check is back to full within a millisecond.
        let limits = RateLimits::new(&config(1000));
        for i in 0..1000u32 {
            let _ = limits.check_address(IpAddr::V4(Ipv4Addr::from_bits(i)));
        }
        assert_eq!(limits.keys(), 1000);
        std::thread::sleep(Duration::from_millis(20));
        // Enough checks to pass a multiple of RETAIN_EVERY after the sleep.
        for _ in 0..2 * RETAIN_EVERY {
            let _ = limits.check_token("t");
        }
        assert!(limits.keys() < 10, "{}", limits.keys());
    }
}
