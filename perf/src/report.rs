//! Collecting samples per metric and variant, and turning them into
//! medians, ratios against direct, and a Markdown table.

use serde::Serialize;

use crate::stats::{median, ratio};

/// What one row of the results measures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricDef {
    /// Stable key, e.g. "throughput.8.gbps".
    pub id: String,
    /// The scenario as run, e.g. "throughput 8×128 MiB up".
    pub scenario: String,
    /// What is measured and its unit, e.g. "Gbit/s".
    pub name: String,
    pub higher_is_better: bool,
    /// Decimals in the table.
    pub digits: usize,
}

impl MetricDef {
    pub fn new(
        id: impl Into<String>,
        scenario: &str,
        name: &str,
        higher: bool,
        digits: usize,
    ) -> Self {
        MetricDef {
            id: id.into(),
            scenario: scenario.to_string(),
            name: name.to_string(),
            higher_is_better: higher,
            digits,
        }
    }
}

/// Samples of every metric for every variant, in first-seen row order.
#[derive(Clone, Debug, Default)]
pub struct Collector {
    pub variants: Vec<String>,
    rows: Vec<(MetricDef, Vec<Vec<f64>>)>,
}

impl Collector {
    pub fn new(variants: Vec<String>) -> Collector {
        Collector {
            variants,
            rows: Vec::new(),
        }
    }

    pub fn add(&mut self, def: &MetricDef, variant: usize, value: f64) {
        let n = self.variants.len();
        let row = match self.rows.iter().position(|(d, _)| d.id == def.id) {
            Some(i) => i,
            None => {
                self.rows.push((def.clone(), vec![Vec::new(); n]));
                self.rows.len() - 1
            }
        };
        self.rows[row].1[variant].push(value);
    }

    /// Medians and ratios against the variant at index `baseline`.
    pub fn summarize(&self, baseline: usize) -> Vec<MetricSummary> {
        self.rows
            .iter()
            .map(|(def, samples)| {
                let base = samples.get(baseline).and_then(|s| median(s));
                MetricSummary {
                    def: def.clone(),
                    values: samples
                        .iter()
                        .zip(&self.variants)
                        .map(|(s, key)| {
                            let m = median(s);
                            VariantValue {
                                variant: key.clone(),
                                samples: s.clone(),
                                median: m,
                                ratio_vs_direct: ratio(m, base),
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct VariantValue {
    pub variant: String,
    pub samples: Vec<f64>,
    pub median: Option<f64>,
    pub ratio_vs_direct: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MetricSummary {
    #[serde(flatten)]
    pub def: MetricDef,
    pub values: Vec<VariantValue>,
}

impl MetricSummary {
    pub fn median_of(&self, variant: &str) -> Option<f64> {
        self.values
            .iter()
            .find(|v| v.variant == variant)
            .and_then(|v| v.median)
    }
}

pub fn fmt_num(v: Option<f64>, digits: usize) -> String {
    match v {
        None => "–".into(),
        Some(x) if x.abs() >= 1e5 => format!("{x:.0}"),
        Some(x) => format!("{x:.digits$}"),
    }
}

/// A value and, when there is one, its ratio: "4000 (0.44×)".
pub fn with_ratio(
    v: Option<f64>,
    digits: usize,
    ratio: Option<f64>,
    ratio_digits: usize,
) -> String {
    let mut cell = fmt_num(v, digits);
    if let Some(r) = ratio {
        cell += &format!(" ({r:.ratio_digits$}×)");
    }
    cell
}

/// The first two cells of each row of a results table: the scenario
/// (blank under a row of the same scenario) and the metric with its arrow
/// (↑ higher is better, ↓ lower is).
#[derive(Default)]
pub struct RowHeads<'a> {
    last: &'a str,
}

impl<'a> RowHeads<'a> {
    pub fn next(&mut self, scenario: &'a str, metric: &str, higher_is_better: bool) -> String {
        let shown = if scenario == self.last { "" } else { scenario };
        self.last = scenario;
        let arrow = if higher_is_better { "↑" } else { "↓" };
        format!("| {shown} | {metric} {arrow} |")
    }
}

/// One table: a row per metric, a column per variant ("value (ratio×)").
pub fn markdown_table(metrics: &[MetricSummary], labels: &[String]) -> String {
    let mut s = String::from("| scenario | metric |");
    for l in labels {
        s += &format!(" {} |", l.replace('|', "/"));
    }
    s += "\n|---|---|";
    s += &"---:|".repeat(labels.len());
    s += "\n";
    let mut heads = RowHeads::default();
    for m in metrics {
        s += &heads.next(&m.def.scenario, &m.def.name, m.def.higher_is_better);
        for v in &m.values {
            let r = v.ratio_vs_direct.filter(|_| v.variant != "direct");
            s += &format!(" {} |", with_ratio(v.median, m.def.digits, r, 2));
        }
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(id: &str) -> MetricDef {
        MetricDef::new(id, "throughput 1×1 GiB up", "Gbit/s", true, 2)
    }

    #[test]
    fn medians_and_ratios_per_variant() {
        let mut c = Collector::new(vec!["direct".into(), "hbone".into(), "peer".into()]);
        let gbps = def("throughput.1.gbps");
        for (v, x) in [
            (0, 10.0),
            (0, 12.0),
            (0, 11.0),
            (1, 5.0),
            (1, 6.0),
            (1, 4.0),
        ] {
            c.add(&gbps, v, x);
        }
        let cpu = MetricDef::new(
            "throughput.1.cpu",
            "throughput 1×1 GiB up",
            "proxy CPU s/GiB",
            false,
            3,
        );
        c.add(&cpu, 1, 0.5);
        c.add(&cpu, 1, 0.7);
        let s = c.summarize(0);
        assert_eq!(s.len(), 2);
        let direct = &s[0].values[0];
        assert_eq!(direct.median, Some(11.0));
        assert_eq!(direct.ratio_vs_direct, Some(1.0));
        let hbone = &s[0].values[1];
        assert_eq!(hbone.samples, [5.0, 6.0, 4.0]);
        assert_eq!(hbone.median, Some(5.0));
        assert!((hbone.ratio_vs_direct.unwrap() - 5.0 / 11.0).abs() < 1e-12);
        // No samples: no median, no ratio.
        assert_eq!(s[0].values[2].median, None);
        assert_eq!(s[0].values[2].ratio_vs_direct, None);
        // CPU: only the proxy has it, so no ratio against direct.
        assert_eq!(s[1].median_of("hbone"), Some(0.6));
        assert_eq!(s[1].values[1].ratio_vs_direct, None);

        let md = markdown_table(
            &s,
            &["direct".into(), "ringway hbone".into(), "peer".into()],
        );
        assert!(
            md.contains("| throughput 1×1 GiB up | Gbit/s ↑ | 11.00 | 5.00 (0.45×) | – |"),
            "{md}"
        );
        assert!(
            md.contains("|  | proxy CPU s/GiB ↓ | – | 0.600 | – |"),
            "{md}"
        );
    }
}
