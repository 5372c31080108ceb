//! `bench --plot FILE.svg`: codes/s over the run against the 50/s line, and each case's stage
//! shares. Plain SVG written by hand: two charts do not need a plotting crate.

use super::Report;
use crate::package::CODES_PER_SECOND;

const W: f64 = 900.0;
const H1: f64 = 320.0;
const PAD: f64 = 50.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn render(report: &Report) -> String {
    // Rate over windows of ten codes, per run, on one time axis.
    let mut points: Vec<(f64, f64)> = Vec::new();
    for r in &report.runs {
        for w in r.code_times_s.windows(2) {
            let dt = w[1] - w[0];
            if dt > 0.0 {
                points.push((w[1], 10.0 / dt));
            }
        }
    }
    let t_max = points.iter().map(|p| p.0).fold(1e-9, f64::max);
    let r_max = points.iter().map(|p| p.1).fold(60.0, f64::max) * 1.1;
    let x = |t: f64| PAD + t / t_max * (W - 2.0 * PAD);
    let y = |r: f64| H1 - PAD + -(r / r_max) * (H1 - 2.0 * PAD);
    let stage_h = 28.0 * report.cases.len() as f64 + 80.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{PAD}\" y=\"20\" font-size=\"14\">codes/s over the run — {}</text>\n",
        H1 + stage_h,
        esc(&report.engine)
    );
    s.push_str(&format!(
        "<line x1=\"{PAD}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"black\"/><line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{0}\" stroke=\"black\"/>\n",
        H1 - PAD,
        W - PAD
    ));
    for k in 0..=4 {
        let r = r_max * f64::from(k) / 4.0;
        s.push_str(&format!(
            "<text x=\"5\" y=\"{:.1}\">{r:.0}</text>\n",
            y(r) + 4.0
        ));
    }
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\">{t_max:.1} s</text>\n",
        W - PAD - 30.0,
        H1 - PAD + 16.0
    ));
    let poly: Vec<String> = points
        .iter()
        .map(|&(t, r)| format!("{:.1},{:.1}", x(t), y(r)))
        .collect();
    s.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n",
        poly.join(" ")
    ));
    s.push_str(&format!(
        "<line x1=\"{PAD}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/><text x=\"{2}\" y=\"{3:.1}\" fill=\"#d62728\">real time: 50 codes/s</text>\n",
        y(CODES_PER_SECOND),
        W - PAD,
        W - PAD - 150.0,
        y(CODES_PER_SECOND) - 6.0
    ));
    // Stage shares per case.
    let top = H1 + 20.0;
    s.push_str(&format!(
        "<text x=\"{PAD}\" y=\"{top}\" font-size=\"14\">time per stage (median share)</text>\n"
    ));
    let colors = ["#9467bd", "#ff7f0e", "#1f77b4", "#2ca02c", "#8c564b"];
    let names = ["front end", "prefill", "decode", "codec", "encode"];
    for (i, c) in report.cases.iter().enumerate() {
        let st = &c.stage_ms;
        let parts = [
            st.front_end.median,
            st.prefill.median,
            st.decode.median,
            st.codec.median,
            st.encode.median,
        ];
        let total: f64 = parts.iter().sum::<f64>().max(1e-9);
        let yy = top + 12.0 + 28.0 * i as f64;
        s.push_str(&format!(
            "<text x=\"5\" y=\"{:.1}\">{}/{}</text>\n",
            yy + 14.0,
            esc(&c.case),
            esc(&c.voice)
        ));
        let mut xx = 120.0;
        for (k, p) in parts.iter().enumerate() {
            let w = p / total * (W - 140.0);
            s.push_str(&format!(
                "<rect x=\"{xx:.1}\" y=\"{yy:.1}\" width=\"{w:.1}\" height=\"20\" fill=\"{}\"><title>{}: {p:.1} ms</title></rect>\n",
                colors[k], names[k]
            ));
            xx += w;
        }
    }
    let ly = top + 20.0 + 28.0 * report.cases.len() as f64;
    for (k, n) in names.iter().enumerate() {
        let lx = 120.0 + 130.0 * k as f64;
        s.push_str(&format!(
            "<rect x=\"{lx}\" y=\"{ly}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{n}</text>\n",
            colors[k],
            lx + 16.0,
            ly + 11.0
        ));
    }
    s.push_str("</svg>\n");
    s
}
