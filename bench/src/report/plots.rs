//! PNG plots with `plotters` (bitmap backend, DejaVu Sans shipped in `bench/assets/`).

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register() {
    REGISTER.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// One colour per router, in `RouterKind::ALL` order (Kinference last, in black).
fn color(i: usize, name: &str) -> RGBColor {
    if name == "kinference" {
        return RGBColor(0, 0, 0);
    }
    const C: [RGBColor; 7] = [
        RGBColor(228, 26, 28),
        RGBColor(255, 127, 0),
        RGBColor(166, 86, 40),
        RGBColor(55, 126, 184),
        RGBColor(77, 175, 74),
        RGBColor(152, 78, 163),
        RGBColor(247, 129, 191),
    ];
    C[i % C.len()]
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// TTFT CDFs: `series` = (router, TTFT quantiles at evenly spaced probabilities). Log x axis.
pub fn cdf(path: &Path, title: &str, series: &[(String, Vec<f64>)]) -> Result<(), String> {
    register();
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let lo = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|x| *x > 0.0)
        .fold(f64::INFINITY, f64::min)
        .max(1e-3);
    let hi = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(lo * 10.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((lo * 0.8..hi * 1.2).log_scale(), 0.0f64..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("TTFT (s, log scale)")
        .y_desc("fraction of requests")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, (name, q)) in series.iter().enumerate() {
        let n = q.len().max(2) - 1;
        let c = color(i, name);
        let width = if name == "kinference" { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(
                q.iter()
                    .enumerate()
                    .map(|(k, &x)| (x.max(lo * 0.8), k as f64 / n as f64)),
                c.stroke_width(width),
            ))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Goodput vs concurrency: `series` = (router, (concurrency, goodput req/min)).
pub fn goodput(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    register();
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let hi = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .filter(|x| x.is_finite())
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0f64..34.0, 0.0f64..hi * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("concurrency (closed loop)")
        .y_desc("goodput (requests/min meeting the TTFT SLO)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = color(i, name);
        let width = if name == "kinference" { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(width)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
