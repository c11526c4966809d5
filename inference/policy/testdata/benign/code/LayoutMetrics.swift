import CoreGraphics
import Foundation

/// Layout constants for the dashboard's iPad and iPhone layouts.
enum LayoutMetrics {
    static let gridColumns = 12
    static let gutter: CGFloat = 16
    static let cornerRadius: CGFloat = 12
    static let chartAspect: CGFloat = 16.0 / 9.0
    static let animation: TimeInterval = 0.25
    static let refresh: TimeInterval = 15

    /// Screen sizes in points we test against (portrait).
    static let devices: [(name: String, size: CGSize, scale: CGFloat)] = [
        ("iPhone SE", CGSize(width: 375, height: 667), 2),
        ("iPhone 15", CGSize(width: 393, height: 852), 3),
        ("iPhone 15 Pro Max", CGSize(width: 430, height: 932), 3),
        ("iPad mini", CGSize(width: 744, height: 1133), 2),
        ("iPad Pro 12.9", CGSize(width: 1024, height: 1366), 2),
    ]

    static func columnWidth(for width: CGFloat, columns: Int = gridColumns) -> CGFloat {
        (width - gutter * CGFloat(columns + 1)) / CGFloat(columns)
    }

    static func chartHeight(for width: CGFloat) -> CGFloat {
        (width / chartAspect).rounded(.down)
    }
}

// (lldb) po LayoutMetrics.devices.map { ($0.name, LayoutMetrics.columnWidth(for: $0.size.width)) }
// ▿ 5 elements
//   - ("iPhone SE", 13.583333333333334)
//   - ("iPhone 15", 15.083333333333334)
//   - ("iPhone 15 Pro Max", 18.166666666666668)
//   - ("iPad mini", 44.666666666666664)
//   - ("iPad Pro 12.9", 67.66666666666667)
// (lldb) po LayoutMetrics.chartHeight(for: 1024)
// 576.0
// (lldb) po Bundle.main.infoDictionary?["CFBundleShortVersionString"], Bundle.main.infoDictionary?["CFBundleVersion"]
// ("2.4.3", "2024.3.5.1")
