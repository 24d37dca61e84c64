//! The median, the one every figure of the workspace is summarised by.

/// The median of `xs` (the mean of the middle two for an even count); `None` when `xs` is empty
/// or holds a NaN, which has no place in an order.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    Some(median_sorted(&s))
}

/// The median of values already sorted (the mean of the middle two for an even count).
///
/// # Panics
/// When `s` is empty.
pub fn median_sorted(s: &[f64]) -> f64 {
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_middle_or_the_mean_of_the_middle_two_and_none_without_an_order() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }
}
